//! Who may reach the admin API: the one rule every way of starting drover applies
//! (`drover up`, `drover proxy --config`, `drover run`), and `drover_admin::AdminServer`
//! checks again. It lives with the config model because it judges configured values
//! (an address and a token), so checking a config needs no admin server.
//!
//! The API can scale, reload and stop workers. On a loopback address only local users
//! reach it; anywhere else (`0.0.0.0`, a LAN address) it must not be open to whoever
//! can connect, so a token is required rather than trusting a firewall.

use std::fmt;
use std::net::SocketAddr;

/// Why an admin API may not listen as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExposureError {
    /// A token that is empty or only white space protects nothing.
    EmptyToken,
    /// `listen` is not a loopback address and there is no token.
    TokenRequired { listen: SocketAddr },
}

impl fmt::Display for ExposureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExposureError::EmptyToken => f.write_str("token must not be empty"),
            ExposureError::TokenRequired { listen } => write!(
                f,
                "a token is required because the admin API's address ({listen}) is not a loopback address"
            ),
        }
    }
}

impl std::error::Error for ExposureError {}

/// Checks the rule for an admin API on `listen` guarded by `token`.
pub fn check_exposure(listen: SocketAddr, token: Option<&str>) -> Result<(), ExposureError> {
    match token {
        Some(t) if t.trim().is_empty() => Err(ExposureError::EmptyToken),
        Some(_) => Ok(()),
        None if listen.ip().is_loopback() => Ok(()),
        None => Err(ExposureError::TokenRequired { listen }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn off_loopback_needs_a_token_and_a_token_must_say_something() {
        for open in [
            "0.0.0.0:9900",
            "[::]:9900",
            "10.1.2.3:9900",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert_eq!(
                check_exposure(addr(open), None),
                Err(ExposureError::TokenRequired { listen: addr(open) }),
                "{open}"
            );
            assert_eq!(check_exposure(addr(open), Some("s3cret")), Ok(()));
        }
        for local in ["127.0.0.1:9900", "127.1.2.3:0", "[::1]:9900"] {
            assert_eq!(check_exposure(addr(local), None), Ok(()), "{local}");
        }
        assert_eq!(
            check_exposure(addr("127.0.0.1:9900"), Some(" ")),
            Err(ExposureError::EmptyToken)
        );
        assert!(ExposureError::TokenRequired {
            listen: addr("0.0.0.0:1")
        }
        .to_string()
        .contains("not a loopback address"));
    }
}
