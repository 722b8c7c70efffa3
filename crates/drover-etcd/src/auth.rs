//! etcd's user authentication (a cluster with `etcdctl auth enable`): drover logs in as
//! a user, with a password the caller reads (from a file: never from the config, which
//! is often world-readable or committed), at each new client. etcd answers a login with
//! a token that lapses (`--auth-token-ttl`, 5 minutes unused by default): a request
//! that meets a lapsed token drops the client, so the next one logs in again, and the
//! member operation that met it is tried once more (`EtcdState::token_lapsed`).

use std::fmt;
use std::sync::Arc;

/// Reads the password again: called at each login, so a password changed on disk is
/// used from the next one on. An error names the file and why.
pub type LoadPassword = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// `EtcdOptions::auth`: the user, and a loader of its password.
#[derive(Clone)]
pub struct EtcdAuth {
    pub user: String,
    pub password: LoadPassword,
}

impl fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl PartialEq for EtcdAuth {
    fn eq(&self, other: &Self) -> bool {
        self.user == other.user && Arc::ptr_eq(&self.password, &other.password)
    }
}
