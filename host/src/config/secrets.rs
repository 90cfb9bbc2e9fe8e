//! `[route.secrets]`: values a handler may read, from the environment or a
//! file, read once at startup and kept out of every log line and header.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// A secret's value. Its `Debug` never shows the value, so a config
/// printed for debugging leaks nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The secrets a route grants, by name, read once at startup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Secrets(BTreeMap<String, Secret>);

impl Secrets {
    pub fn get(&self, name: &str) -> Option<&Secret> {
        self.0.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn insert(&mut self, name: &str, value: String) {
        self.0.insert(name.to_string(), Secret(value.into()));
    }

    /// `text` with every secret value in it replaced by `[secret NAME]`.
    /// Borrows when there is nothing to replace, which is the common case.
    pub fn redact<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        let mut out = std::borrow::Cow::Borrowed(text);
        for (name, secret) in &self.0 {
            if out.contains(secret.expose()) {
                out = out
                    .replace(secret.expose(), &format!("[secret {name}]"))
                    .into();
            }
        }
        out
    }
}

/// Reads a secret from `env:VARIABLE` or `file:PATH`. A problem names the
/// variable or file, never the value.
pub(super) fn read_secret(name: &str, source: &str, base: &Path) -> Result<String, String> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("a secret name has only ASCII letters, digits, `-`, `_` and `.`".into());
    }
    let value = if let Some(var) = source.strip_prefix("env:") {
        match std::env::var(var) {
            Ok(value) => value,
            Err(std::env::VarError::NotPresent) => {
                return Err(format!("environment variable {var} is not set"));
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(format!("environment variable {var} is not UTF-8"));
            }
        }
    } else if let Some(path) = source.strip_prefix("file:") {
        let path = base.join(path);
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("cannot read file {}: {e}", path.display()))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| format!("file {} is not UTF-8 text", path.display()))?;
        // Files written by editors and `echo` end with a newline that is not
        // part of the secret.
        let trimmed = text.strip_suffix('\n').unwrap_or(&text);
        trimmed.strip_suffix('\r').unwrap_or(trimmed).to_string()
    } else {
        return Err(format!(
            "source `{source}` is neither `env:VARIABLE` nor `file:PATH`"
        ));
    };
    if value.is_empty() {
        return Err(format!("{source} is empty"));
    }
    Ok(value)
}
