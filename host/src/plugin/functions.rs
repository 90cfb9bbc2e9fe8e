//! Compiled functions on disk, for Cranelift's incremental compilation
//! cache: a new version of a handler compiles only the functions that
//! changed. A Python or JavaScript handler is mostly its interpreter, which
//! an edit of the handler's own code leaves as it was; without this, every
//! version compiled all of it again.
//!
//! Cranelift asks for each function by a key that digests its code and
//! everything its compiled form depends on, and hands over what it compiled
//! on a miss. The entries live in memory and in one pack file beside the
//! compiled-handler cache ([`super::ArtifactCache`]), in the same directory,
//! under the same ownership checks: whoever can write an entry chooses code
//! hopper runs. The pack holds records of `sha256(key)`, the value's length,
//! `sha256(value)` and the value. A record whose digest does not match ends
//! the read (a torn write at a crash): the entries before it are kept, and
//! the pack is written again without the rest at the next compile.
//!
//! The pack is bounded (a quarter of `[limits] cache_max_mib`). After each compile,
//! past its bound, the entries least recently used are dropped (by the
//! compile that last asked for them, or put them), and the pack is written
//! again, atomically.

use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

const MAGIC: &[u8; 8] = b"hopperf1";
/// `sha256(key)`, the value's length (u32, little-endian), `sha256(value)`.
const RECORD_HEADER: usize = 32 + 4 + 32;

type Key = [u8; 32];

struct Entry {
    value: Arc<[u8]>,
    /// The compile that last asked for it or put it.
    used: u64,
}

#[derive(Default)]
struct Index {
    entries: HashMap<Key, Entry>,
    /// Every entry's value, in bytes, with its record's header.
    bytes: u64,
    /// Entries put since the last [`FunctionCache::flush`], to append.
    unwritten: Vec<Key>,
    /// Whether the pack holds records that are no longer entries (a torn
    /// tail, entries dropped): it is written again, whole, at the next flush.
    rewrite: bool,
    /// The compile now running: bumped by each flush.
    compile: u64,
}

/// What the cache did since it opened, for the load's log line and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FunctionStats {
    /// Functions found.
    pub hits: u64,
    /// Functions compiled and put.
    pub misses: u64,
    /// Entries now, and their bytes.
    pub entries: u64,
    pub bytes: u64,
}

/// Cranelift's store of compiled functions ([`wasmtime::CacheStore`]).
/// Installed in every engine; it keeps nothing until
/// [`FunctionCache::open`] gives it a directory.
#[derive(Default)]
pub struct FunctionCache {
    pack: OnceLock<PathBuf>,
    index: Mutex<Index>,
    hits: AtomicU64,
    misses: AtomicU64,
    max_bytes: AtomicU64,
}

impl std::fmt::Debug for FunctionCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FunctionCache")
            .field("pack", &self.pack.get())
            .finish_non_exhaustive()
    }
}

impl FunctionCache {
    /// The pack's bound with no `[limits] cache_max_mib`: a quarter of its
    /// default, room for the interpreters of a few Python and JavaScript
    /// handlers, each version's few changed functions besides.
    pub const MAX_BYTES: u64 = (crate::config::DEFAULT_CACHE_MAX_MIB << 20) / 4;

    /// Keeps the functions of the engine tagged `engine_tag` in `dir`, a
    /// directory [`super::ArtifactCache::open`] checked, reading what the
    /// pack there holds. A second call changes nothing.
    pub fn open(&self, dir: &Path, engine_tag: &str) {
        let path = dir.join(format!("functions-{engine_tag}.pack"));
        if self.pack.set(path.clone()).is_err() {
            return;
        }
        self.max_bytes.store(Self::MAX_BYTES, Ordering::Relaxed);
        let Ok(bytes) = std::fs::read(&path) else {
            return;
        };
        let mut index = self.index.lock().unwrap();
        let read = read_pack(&bytes, &mut index);
        if read < bytes.len() {
            tracing::warn!(
                pack = %path.display(),
                kept = index.entries.len(),
                "The compiled-function cache ends in a torn or corrupt record; the records before it are kept."
            );
            index.rewrite = true;
        }
    }

    /// A bound other than [`FunctionCache::MAX_BYTES`]: a quarter of
    /// `[limits] cache_max_mib` ([`super::Runtime::with_cache_limit`]).
    pub fn set_max_bytes(&self, bytes: u64) {
        self.max_bytes.store(bytes, Ordering::Relaxed);
    }

    pub fn stats(&self) -> FunctionStats {
        let index = self.index.lock().unwrap();
        FunctionStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: index.entries.len() as u64,
            bytes: index.bytes,
        }
    }

    /// Ends a compile: appends what it put to the pack, and past the bound
    /// drops the entries least recently used and writes the pack again. A
    /// write that fails is logged; the entries stay in memory.
    pub fn flush(&self) {
        let Some(path) = self.pack.get() else { return };
        let mut index = self.index.lock().unwrap();
        index.compile += 1;
        let max = self.max_bytes.load(Ordering::Relaxed);
        if index.bytes > max {
            evict(&mut index, max);
        }
        let written = if index.rewrite {
            rewrite(path, &index)
        } else if index.unwritten.is_empty() {
            return;
        } else {
            append(path, &index)
        };
        match written {
            Ok(()) => {
                index.unwritten.clear();
                index.rewrite = false;
            }
            Err(e) => {
                tracing::warn!(pack = %path.display(), error = %e, "Cannot write the compiled-function cache.");
            }
        }
    }
}

impl wasmtime::CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        self.pack.get()?;
        let key: Key = Sha256::digest(key).into();
        let mut index = self.index.lock().unwrap();
        let compile = index.compile;
        let entry = index.entries.get_mut(&key)?;
        entry.used = compile;
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(Cow::Owned(entry.value.to_vec()))
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        if self.pack.get().is_none() || u32::try_from(value.len()).is_err() {
            return false;
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let key: Key = Sha256::digest(key).into();
        let mut index = self.index.lock().unwrap();
        let used = index.compile;
        let size = (RECORD_HEADER + value.len()) as u64;
        let entry = Entry {
            value: value.into(),
            used,
        };
        match index.entries.insert(key, entry) {
            Some(old) => {
                index.bytes -= (RECORD_HEADER + old.value.len()) as u64;
                index.rewrite = true;
            }
            None => index.unwritten.push(key),
        }
        index.bytes += size;
        true
    }
}

/// Reads the records of `pack` into `index`; returns how many bytes were
/// sound.
fn read_pack(pack: &[u8], index: &mut Index) -> usize {
    if pack.len() < MAGIC.len() || &pack[..MAGIC.len()] != MAGIC {
        return 0;
    }
    let mut at = MAGIC.len();
    while pack.len() - at >= RECORD_HEADER {
        let header = &pack[at..at + RECORD_HEADER];
        let key: Key = header[..32].try_into().unwrap();
        let len = u32::from_le_bytes(header[32..36].try_into().unwrap()) as usize;
        let digest = &header[36..];
        let Some(value) = pack.get(at + RECORD_HEADER..at + RECORD_HEADER + len) else {
            break;
        };
        if Sha256::digest(value).as_slice() != digest {
            break;
        }
        let entry = Entry {
            value: value.into(),
            used: 0,
        };
        if let Some(old) = index.entries.insert(key, entry) {
            index.bytes -= (RECORD_HEADER + old.value.len()) as u64;
            index.rewrite = true;
        }
        index.bytes += (RECORD_HEADER + len) as u64;
        at += RECORD_HEADER + len;
    }
    at
}

/// Drops the entries least recently used until `index` is within `max`.
fn evict(index: &mut Index, max: u64) {
    let mut by_use: Vec<(u64, Key, u64)> = index
        .entries
        .iter()
        .map(|(key, entry)| (entry.used, *key, (RECORD_HEADER + entry.value.len()) as u64))
        .collect();
    by_use.sort_unstable();
    for (_, key, size) in by_use {
        if index.bytes <= max {
            break;
        }
        index.entries.remove(&key);
        index.bytes -= size;
    }
    let entries = &index.entries;
    index.unwritten.retain(|key| entries.contains_key(key));
    index.rewrite = true;
}

fn record(out: &mut Vec<u8>, key: &Key, value: &[u8]) {
    out.extend_from_slice(key);
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(value));
    out.extend_from_slice(value);
}

/// Appends the entries put since the last flush.
fn append(path: &Path, index: &Index) -> std::io::Result<()> {
    let mut out = Vec::new();
    let new = std::fs::metadata(path)
        .map(|m| m.len() == 0)
        .unwrap_or(true);
    if new {
        out.extend_from_slice(MAGIC);
    }
    for key in &index.unwritten {
        if let Some(entry) = index.entries.get(key) {
            record(&mut out, key, &entry.value);
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(&out)
}

/// Writes the pack again, whole, atomically.
fn rewrite(path: &Path, index: &Index) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(MAGIC.len() + index.bytes as usize);
    out.extend_from_slice(MAGIC);
    for (key, entry) in &index.entries {
        record(&mut out, key, &entry.value);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::fs::write(tmp.path(), &out)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::CacheStore as _;

    fn opened(dir: &Path) -> FunctionCache {
        let cache = FunctionCache::default();
        cache.open(dir, "t");
        cache
    }

    #[test]
    fn entries_outlive_the_process_that_put_them() {
        let dir = tempfile::tempdir().unwrap();
        let cache = opened(dir.path());
        assert!(cache.insert(b"f1", b"code one".to_vec()));
        assert!(cache.insert(b"f2", b"code two".to_vec()));
        cache.flush();
        assert!(cache.insert(b"f3", vec![7; 1000]));
        cache.flush();

        let again = opened(dir.path());
        assert_eq!(again.get(b"f1").as_deref(), Some(&b"code one"[..]));
        assert_eq!(again.get(b"f3").as_deref(), Some(&[7; 1000][..]));
        assert_eq!(again.get(b"f4"), None);
        let stats = again.stats();
        assert_eq!((stats.hits, stats.entries), (2, 3), "{stats:?}");
    }

    #[test]
    fn a_cache_without_a_directory_keeps_nothing() {
        let cache = FunctionCache::default();
        assert!(!cache.insert(b"f1", b"code".to_vec()));
        assert_eq!(cache.get(b"f1"), None);
        cache.flush();
    }

    #[test]
    fn a_torn_or_corrupt_record_ends_the_read_and_the_rest_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let cache = opened(dir.path());
        cache.insert(b"f1", b"code one".to_vec());
        cache.insert(b"f2", b"code two".to_vec());
        cache.flush();
        let path = dir.path().join("functions-t.pack");
        let sound = std::fs::read(&path).unwrap();

        // A torn write: half of a third record.
        let mut torn = sound.clone();
        torn.extend_from_slice(&[1; RECORD_HEADER / 2]);
        std::fs::write(&path, &torn).unwrap();
        let read = opened(dir.path());
        assert_eq!(read.stats().entries, 2);
        read.insert(b"f3", b"three".to_vec());
        read.flush();
        let again = opened(dir.path());
        assert_eq!(again.stats().entries, 3, "the torn tail is gone");

        // A flipped bit in the last record's value.
        let mut flipped = sound;
        *flipped.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        let read = opened(dir.path());
        assert_eq!(read.stats().entries, 1);

        // Not a pack at all.
        std::fs::write(&path, b"something else").unwrap();
        assert_eq!(opened(dir.path()).stats().entries, 0);
    }

    #[test]
    fn past_its_bound_the_entries_least_recently_used_go_first() {
        let dir = tempfile::tempdir().unwrap();
        let cache = opened(dir.path());
        let size = (RECORD_HEADER + 100) as u64;
        cache.set_max_bytes(3 * size);
        // Compile 0 puts a, b and c; compile 1 asks for a and c, and puts d.
        for key in [b"a", b"b", b"c"] {
            cache.insert(key, vec![0; 100]);
        }
        cache.flush();
        assert!(cache.get(b"a").is_some());
        assert!(cache.get(b"c").is_some());
        cache.insert(b"d", vec![0; 100]);
        cache.flush();
        let kept: Vec<bool> = [b"a", b"b", b"c", b"d"]
            .iter()
            .map(|key| cache.get(*key).is_some())
            .collect();
        assert_eq!(kept, [true, false, true, true]);
        assert!(cache.stats().bytes <= 3 * size);
        let on_disk = std::fs::metadata(dir.path().join("functions-t.pack"))
            .unwrap()
            .len();
        assert_eq!(on_disk, MAGIC.len() as u64 + 3 * size);
    }
}
