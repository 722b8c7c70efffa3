//! drover-config: the one typed model of what drover runs, and the two ways to fill it.
//!
//! - [`model`]: [`Config`] and its parts, every default defined once.
//! - [`file`]: a drover.toml, loaded and validated (errors name the file, line and key).
//! - [`flags`]: `drover run` and `drover proxy` flags (clap), filling the same model.
//! - [`plan`]: a validated balancer turned into the parts that run it. An app needs no
//!   such step: its model holds the supervisor's own spec.
//! - [`preflight`]: every balancer planned and each app's spec and program checked, with
//!   every error at once: what `drover up`, `drover check` and a reload check first.
//! - [`ecosystem`]: PM2's ecosystem file, evaluated by Node and mapped onto the same
//!   model, for `drover run ecosystem.config.js`.
//! - [`exposure`]: who may reach the admin API ([`check_exposure`]), the rule the file,
//!   the flags and the admin server all apply.
//!
//! Configuration files: the TOML schema, its loader and its validation.
//!
//! Loading happens in two passes over private `Raw*` structs:
//!
//! 1. serde deserializes the text. Everything that can be checked on one value alone
//!    (durations, addresses, ranges, strategy names, backend syntax) is checked here by
//!    small newtypes, so toml attaches the value's byte span to the error and
//!    `serde_path_to_error` tells us the key path.
//! 2. `validate` checks what needs more than one value (hash key vs. strategy, `app:NAME`
//!    references, duplicates, the admin token). The raw structs keep `toml::Spanned`
//!    wrappers on exactly the values these checks report on, so those errors carry a
//!    line and column too.
//!
//! The result is a plain, typed [`Config`] with every default filled in; nothing
//! downstream ever sees a `Raw*` type or an unvalidated value.

pub mod ecosystem;
pub mod exposure;
pub mod file;
pub mod flags;
pub mod model;
pub mod plan;
pub mod pm2_order;
pub mod preflight;

pub use exposure::{check_exposure, ExposureError};
pub use file::{
    backend_from_flag, check_etcd_endpoint, etcd_endpoints_use_tls, is_valid_name, load,
    load_with_origins, nameserver, parse, ConfigError, Origins, NAME_RULE,
};
pub use model::*;
