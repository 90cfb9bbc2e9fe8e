//! [`Error`]: why [`crate::Hopper::start`] failed, by kind, each kind
//! carrying the typed error of the module it came from.

use crate::admin::AdminError;
use crate::config::ConfigError;
use crate::kafka::KafkaError;
use crate::plugin::{CacheError, LoadError, RuntimeError};
use crate::reload::ReloadError;
use crate::trace::ExportError;
use std::fmt;

/// Why hopper did not start. An embedder matches the kind; each carries
/// the error of its module, whose message names the thing at fault.
///
/// `{}` prints the error's own message, `{:#}` the message and every cause
/// after it, separated by `: ` (as `anyhow` prints a chain), and
/// [`std::error::Error::source`] walks the same causes.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The config, or the options it was started with, cannot run: no
    /// brokers, a shutdown timeout too long.
    Config(ConfigError),
    /// Kafka refused or did not answer: no broker reachable, credentials
    /// refused, topics missing or not created, a client librdkafka would not
    /// make, the delay relay's cancellation table not loaded.
    Kafka(KafkaError),
    /// One or more handlers could not be loaded, or the WebAssembly
    /// runtime could not be made.
    Handler(HandlerError),
    /// A file or directory hopper needs could not be used: the
    /// compiled-handler cache, the handler files' directories to watch.
    Io(IoError),
    /// The admin server could not listen.
    Admin(AdminError),
    /// Span export (`[tracing]`) could not start.
    Tracing(ExportError),
}

/// Why the handlers could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error("starting the WebAssembly runtime")]
    Runtime(#[source] RuntimeError),
    /// Every route whose handler did not load, with why: one line each.
    #[error("{}", Failures(.0))]
    Load(Vec<(String, LoadError)>),
}

/// A file or directory hopper could not use.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Watch(#[from] ReloadError),
}

struct Failures<'a>(&'a [(String, LoadError)]);

impl fmt::Display for Failures<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (route, error)) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "route `{route}`: {error}")?;
        }
        Ok(())
    }
}

impl Error {
    /// What hopper was doing, when the kind's error does not say it.
    fn doing(&self) -> Option<&'static str> {
        match self {
            Error::Tracing(_) => Some("starting span export"),
            _ => None,
        }
    }

    /// The error of the kind.
    fn inner(&self) -> &(dyn std::error::Error + 'static) {
        match self {
            Error::Config(e) => e,
            Error::Kafka(e) => e,
            Error::Handler(e) => e,
            Error::Io(e) => e,
            Error::Admin(e) => e,
            Error::Tracing(e) => e,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.inner();
        match self.doing() {
            Some(doing) => write!(f, "{doing}")?,
            None => write!(f, "{inner}")?,
        }
        if f.alternate() {
            let mut cause = std::error::Error::source(self);
            while let Some(e) = cause {
                write!(f, ": {e}")?;
                cause = e.source();
            }
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    /// The causes of the kind's error (the kind's error itself, after what
    /// hopper was doing).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self.doing() {
            Some(_) => Some(self.inner()),
            None => self.inner().source(),
        }
    }
}

macro_rules! kinds {
    ($($kind:ident($error:ty)),* $(,)?) => {
        $(impl From<$error> for Error {
            fn from(e: $error) -> Error {
                Error::$kind(e.into())
            }
        })*
    };
}

kinds!(
    Config(ConfigError),
    Kafka(KafkaError),
    Handler(HandlerError),
    Io(IoError),
    Io(CacheError),
    Io(ReloadError),
    Admin(AdminError),
    Tracing(ExportError),
);
