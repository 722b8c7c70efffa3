//! drover-ui: the chart library drover's pages (the admin dashboard, `drover bench
//! --html` reports) are drawn with, built into the binary so that a page works offline
//! and asks nothing of any other host.
//!
//! uPlot 1.6.32 (MIT, `vendor/uplot/LICENSE`), from the npm package `uplot`:
//! `dist/uPlot.iife.min.js` and `dist/uPlot.min.css`, unchanged. Chosen for its size
//! (51 KB minified) and speed with tens of thousands of points; to update, `npm pack
//! uplot@1.6` and copy the same two files.

/// uPlot's script: defines the global `uPlot`.
pub const UPLOT_JS: &str = include_str!("../vendor/uplot/uPlot.iife.min.js");

/// uPlot's stylesheet.
pub const UPLOT_CSS: &str = include_str!("../vendor/uplot/uPlot.min.css");

/// uPlot's licence, to serve or embed beside it.
pub const UPLOT_LICENSE: &str = include_str!("../vendor/uplot/LICENSE");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vendored_library_is_whole_and_asks_for_nothing_remote() {
        assert!(UPLOT_JS.contains("uPlot"));
        assert!(UPLOT_CSS.contains(".uplot"));
        assert!(UPLOT_LICENSE.contains("MIT"));
        // The only address in it is the project's, in the licence banner on line 1.
        for text in [UPLOT_JS, UPLOT_CSS] {
            let body = text.split_once('\n').map_or(text, |(_, rest)| rest);
            assert!(!body.contains("http://") && !body.contains("https://"));
        }
    }
}
