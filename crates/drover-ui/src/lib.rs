//! Browser assets that drover serves or writes into pages, compiled into the binary so
//! a page needs no network access at all.
//!
//! uPlot 1.6.32 (MIT, Leon Sorokin), from the npm package: `npm pack uplot@1.6.32`
//! (tarball sha256 4b8a8191e425658e3ea8c8c1314b0fc679c861ee3a1af2b20c7b16ba50b5133d),
//! files `dist/uPlot.iife.min.js`, `dist/uPlot.min.css` and `LICENSE`, unchanged, in
//! `vendor/uplot/`. To update: pack the new version, copy the same three files, and
//! change the version here and in [`UPLOT_VERSION`].

/// The uPlot version vendored in `vendor/uplot/`.
pub const UPLOT_VERSION: &str = "1.6.32";

/// `uPlot.iife.min.js`, verbatim: defines the global `uPlot`.
pub const UPLOT_JS: &str = include_str!("../vendor/uplot/uPlot.iife.min.js");

/// `uPlot.min.css`, verbatim.
pub const UPLOT_CSS: &str = include_str!("../vendor/uplot/uPlot.min.css");

/// uPlot's MIT license text, to ship beside the code in every page that inlines it.
pub const UPLOT_LICENSE: &str = include_str!("../vendor/uplot/LICENSE");

/// [`UPLOT_JS`] without its leading `/*! … */` banner comment. The banner is the
/// project's web address; a page inlining the library should carry the attribution as
/// [`UPLOT_LICENSE`] instead, so that a check for "no external address anywhere in
/// this page" can be strict and still pass.
pub fn uplot_js_without_banner() -> &'static str {
    let js = UPLOT_JS.trim_start();
    match js
        .strip_prefix("/*!")
        .and_then(|rest| rest.find("*/").map(|end| &rest[end + 2..]))
    {
        Some(rest) => rest.trim_start(),
        None => js,
    }
}

/// Escapes text so it can sit inside an inline `<script>` or `<style>` element: the
/// HTML parser ends those at the first `</`, whatever JavaScript or CSS would say, so
/// `</` becomes `<\/`, which means the same inside JS strings and never occurs in
/// uPlot's code or CSS outside strings.
pub fn escape_inline(text: &str) -> String {
    text.replace("</", "<\\/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendored_files_are_the_expected_version() {
        assert!(UPLOT_JS.starts_with(&format!(
            "/*! https://github.com/leeoniya/uPlot (v{UPLOT_VERSION}) */"
        )));
        assert!(UPLOT_JS.contains("uPlot"));
        assert!(UPLOT_CSS.contains(".uplot"));
        assert!(UPLOT_LICENSE.contains("MIT License"));
    }

    #[test]
    fn banner_is_cut_and_code_kept() {
        let js = uplot_js_without_banner();
        assert!(js.starts_with("var uPlot="), "{}", &js[..40]);
        assert!(!js.contains("http://") && !js.contains("https://"));
        assert_eq!(
            UPLOT_JS.len() - js.len(),
            UPLOT_JS.find("var uPlot=").unwrap()
        );
    }

    #[test]
    fn inline_text_cannot_close_its_element() {
        assert_eq!(escape_inline("a</script>b"), "a<\\/script>b");
        assert!(!escape_inline(UPLOT_JS).contains("</"));
    }
}
