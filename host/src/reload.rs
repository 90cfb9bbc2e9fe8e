//! Hot reload: when a route's handler file changes, the new version is
//! compiled in the background, checked against the world, and swapped into
//! the route's [`HandlerSlot`]. Calls in flight finish on the version they
//! started with, because a call clones its `Handler` out of the slot.
//!
//! The watcher watches each handler's *directory* and filters on the file
//! name, so a write that replaces the file by renaming a temp file over it
//! (what `cargo xtask build-plugins`, most build tools and careful editors
//! do) is seen like a write in place. Editors and compilers write in pieces,
//! so a route reloads only once its file has been quiet for [`DEBOUNCE`].
//!
//! A file that cannot be read, compiled or validated leaves the old version
//! serving. The failure is logged and counted ([`Event::HandlerReloadFailed`])
//! and kept as the route's last reload error in [`Reloader::status`] until a
//! later version loads or the file is back to the serving version.
//!
//! One task owns all reload state, so no lock is needed for it: file events
//! (from notify's thread) and finished loads (from the blocking pool) both
//! arrive on its channel. A route has at most one load running; changes seen
//! meanwhile cause one more load after it.

use crate::config::Route;
use crate::events::{self, Telemetry};
use crate::plugin::{Handler, HandlerSlot, LoadError, Runtime};
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher as _};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

/// How long a handler file must be quiet before it is loaded.
pub const DEBOUNCE: Duration = Duration::from_millis(50);

/// Why hot reload could not start. Names the route and the directory.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("route `{route}`: cannot resolve the directory of handler {path}: {source}")]
    Resolve {
        route: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start the handler file watcher: {0}")]
    Watcher(notify::Error),
    #[error("route `{route}`: cannot watch handler directory {dir}: {source}")]
    Watch {
        route: String,
        dir: PathBuf,
        source: notify::Error,
    },
}

/// What one route is serving, for [`crate::Hopper::status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteStatus {
    pub route: String,
    pub handler: PathBuf,
    /// sha256 of the serving version.
    pub version: String,
    /// Why the handler file, as it is now, is not serving; `None` when the
    /// last change loaded.
    pub last_reload_error: Option<String>,
}

/// A route whose handler is reloaded.
pub struct Target {
    pub route: Arc<Route>,
    pub slot: Arc<HandlerSlot>,
}

/// Watches every route's handler file until dropped.
pub struct Reloader {
    targets: Arc<[Target]>,
    /// Last reload error per target, by index. Written by the reload task,
    /// read by `status`; std Mutex, never held across an .await.
    errors: Arc<Mutex<Vec<Option<String>>>>,
    /// Dropping it stops the file events.
    _watcher: notify::RecommendedWatcher,
    /// Dropping it cancels the reload task. A load already running finishes
    /// on the blocking pool, and its result is dropped unused.
    _stop: DropGuard,
    /// The reload task, and the loads it started: each holds the runtime,
    /// so [`Reloader::stop`] waits for them.
    task: JoinHandle<()>,
    loads: TaskTracker,
}

enum Message {
    /// A file event, from notify's thread.
    Fs(notify::Result<notify::Event>),
    /// A load finished, on the blocking pool.
    Loaded { target: usize, outcome: Outcome },
}

enum Outcome {
    /// The file holds the version already serving.
    Unchanged,
    /// The file holds the content whose load failed last time; that failure
    /// was reported already.
    SameFailure,
    Loaded(Handler),
    /// With the sha256 of the content that failed, when it could be read.
    Failed(LoadError, Option<String>),
}

/// Reload state of one target, owned by the reload task.
#[derive(Default)]
struct Pending {
    /// When the file has been quiet long enough to load it.
    due: Option<Instant>,
    /// First file event not yet covered by a load, for the reload's `took`.
    first_event: Option<Instant>,
    /// A load is running; `due` waits for it. Holds the first event that
    /// load covers.
    loading: Option<Option<Instant>>,
    /// sha256 of the content whose load failed last, so a file event that
    /// does not change the content (a late close of the same write) does not
    /// report the same failure twice.
    failed: Option<String>,
}

impl Reloader {
    /// Starts watching. Each file is also checked once right away, so a
    /// change made between the startup load and now is not missed.
    pub fn start(
        runtime: Runtime,
        targets: Vec<Target>,
        telemetry: Telemetry,
    ) -> Result<Reloader, ReloadError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let events = tx.clone();
        let mut watcher = notify::recommended_watcher(move |event| {
            // The receiver is gone only once the reloader is dropped.
            let _ = events.send(Message::Fs(event));
        })
        .map_err(ReloadError::Watcher)?;

        // Every target's file, by its absolute path in a canonical directory,
        // which is how notify names the files in a watched directory.
        let mut files: HashMap<PathBuf, Vec<usize>> = HashMap::new();
        let mut dirs = BTreeSet::new();
        for (index, target) in targets.iter().enumerate() {
            let (dir, file) =
                watch_path(&target.route.handler).map_err(|source| ReloadError::Resolve {
                    route: target.route.name.clone(),
                    path: target.route.handler.clone(),
                    source,
                })?;
            if dirs.insert(dir.clone()) {
                watcher
                    .watch(&dir, RecursiveMode::NonRecursive)
                    .map_err(|source| ReloadError::Watch {
                        route: target.route.name.clone(),
                        dir: dir.clone(),
                        source,
                    })?;
            }
            files.entry(file).or_default().push(index);
        }

        let targets: Arc<[Target]> = targets.into();
        let errors = Arc::new(Mutex::new(vec![None; targets.len()]));
        let task = Task {
            runtime,
            targets: targets.clone(),
            errors: errors.clone(),
            telemetry,
            files,
            loads: TaskTracker::new(),
            pending: (0..targets.len())
                .map(|_| Pending {
                    due: Some(Instant::now()),
                    ..Pending::default()
                })
                .collect(),
            tx,
        };
        let stop = CancellationToken::new();
        let loads = task.loads.clone();
        let task = tokio::spawn(task.run(rx, stop.clone()));
        Ok(Reloader {
            targets,
            errors,
            _watcher: watcher,
            _stop: stop.drop_guard(),
            task,
            loads,
        })
    }

    /// Per route: the handler file, the serving version and the last reload
    /// error, if any.
    pub fn status(&self) -> Vec<RouteStatus> {
        status(&self.targets, &self.errors)
    }

    /// [`Reloader::status`], as a function that may outlive the reloader
    /// and then reports no route. It holds the routes' slots weakly, so
    /// whoever keeps it does not keep the handlers, and their engine, alive.
    pub fn status_reader(&self) -> impl Fn() -> Vec<RouteStatus> + Send + Sync + 'static {
        let targets: Weak<[Target]> = Arc::downgrade(&self.targets);
        let errors = Arc::downgrade(&self.errors);
        move || match (targets.upgrade(), errors.upgrade()) {
            (Some(targets), Some(errors)) => status(&targets, &errors),
            _ => Vec::new(),
        }
    }

    /// Stops watching, and waits for the reload task and any load it
    /// started to end, so nothing of the reloader holds the runtime after.
    /// A load that is compiling finishes first (seconds at most, for a
    /// large component).
    pub async fn stop(self) {
        let Reloader {
            _stop, task, loads, ..
        } = self;
        drop(_stop);
        // The task returns once it sees the cancellation; it cannot panic
        // short of a bug, which the await reports.
        if let Err(e) = task.await {
            tracing::warn!(error = %e, "The reload task ended abnormally.");
        }
        loads.close();
        loads.wait().await;
    }
}

fn status(targets: &[Target], errors: &Mutex<Vec<Option<String>>>) -> Vec<RouteStatus> {
    let errors = errors.lock().unwrap().clone();
    targets
        .iter()
        .zip(errors)
        .map(|(t, last_reload_error)| RouteStatus {
            route: t.route.name.clone(),
            handler: t.route.handler.clone(),
            version: t.slot.current().version().to_string(),
            last_reload_error,
        })
        .collect()
}

/// The directory to watch for `handler`, and the path notify reports for it.
fn watch_path(handler: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
    let name = handler.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path has no file name",
        )
    })?;
    let dir = match handler.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.canonicalize()?,
        _ => std::env::current_dir()?,
    };
    let file = dir.join(name);
    Ok((dir, file))
}

/// Events that may mean new content. Opens and reads, including hopper's
/// own, do not.
fn may_change_content(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

struct Task {
    runtime: Runtime,
    targets: Arc<[Target]>,
    errors: Arc<Mutex<Vec<Option<String>>>>,
    telemetry: Telemetry,
    files: HashMap<PathBuf, Vec<usize>>,
    pending: Vec<Pending>,
    /// Loads running on the blocking pool.
    loads: TaskTracker,
    /// For finished loads to report back.
    tx: mpsc::UnboundedSender<Message>,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Message>, shutdown: CancellationToken) {
        loop {
            let next_due = self
                .pending
                .iter()
                .filter(|p| p.loading.is_none())
                .filter_map(|p| p.due)
                .min();
            let wake = async {
                match next_due {
                    Some(due) => tokio::time::sleep_until(due).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                message = rx.recv() => match message {
                    Some(Message::Fs(event)) => self.on_file_event(event),
                    Some(Message::Loaded { target, outcome }) => self.on_loaded(target, outcome),
                    None => return,
                },
                _ = wake => self.start_due_loads(),
            }
        }
    }

    fn on_file_event(&mut self, event: notify::Result<notify::Event>) {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!(error = %e, "Handler file watcher error; checking every handler file.");
                (0..self.pending.len()).for_each(|i| self.touch(i));
                return;
            }
        };
        if event.need_rescan() {
            (0..self.pending.len()).for_each(|i| self.touch(i));
            return;
        }
        if !may_change_content(&event.kind) {
            return;
        }
        for path in &event.paths {
            if let Some(indexes) = self.files.get(path).cloned() {
                indexes.into_iter().for_each(|i| self.touch(i));
            }
            // Kubernetes updates a ConfigMap or Secret volume by renaming a
            // new `..data` link into place; the handler's own name stays a
            // link through it, and no event names it. Any `..` entry that
            // changes may change every handler of its directory.
            let dotdot = path
                .file_name()
                .is_some_and(|n| n.as_encoded_bytes().starts_with(b".."));
            if dotdot && let Some(dir) = path.parent() {
                let indexes: Vec<usize> = self
                    .files
                    .iter()
                    .filter(|(file, _)| file.parent() == Some(dir))
                    .flat_map(|(_, indexes)| indexes.iter().copied())
                    .collect();
                indexes.into_iter().for_each(|i| self.touch(i));
            }
        }
    }

    /// Target `index`'s file changed: (re)start its quiet period.
    fn touch(&mut self, index: usize) {
        let now = Instant::now();
        let p = &mut self.pending[index];
        p.due = Some(now + DEBOUNCE);
        p.first_event.get_or_insert(now);
    }

    fn start_due_loads(&mut self) {
        let now = Instant::now();
        for (index, p) in self.pending.iter_mut().enumerate() {
            if p.loading.is_some() || !p.due.is_some_and(|due| due <= now) {
                continue;
            }
            p.due = None;
            p.loading = Some(p.first_event.take());
            let target = &self.targets[index];
            let (runtime, route) = (self.runtime.clone(), target.route.clone());
            let serving = target.slot.current().version().to_string();
            let failed = p.failed.clone();
            let tx = self.tx.clone();
            // Compiling takes from milliseconds to seconds: off the async
            // workers, so no partition waits for it.
            self.loads.spawn_blocking(move || {
                let outcome = load(&runtime, &route, &serving, failed.as_deref());
                let _ = tx.send(Message::Loaded {
                    target: index,
                    outcome,
                });
            });
        }
    }

    fn on_loaded(&mut self, index: usize, outcome: Outcome) {
        // Events that came during the load are in `first_event`, for the
        // next load.
        let p = &mut self.pending[index];
        let first_event = p.loading.take().flatten();
        if !matches!(outcome, Outcome::SameFailure) {
            p.failed = None;
        }
        let target = &self.targets[index];
        let route = &target.route.name;
        match outcome {
            Outcome::Unchanged => {
                if self.errors.lock().unwrap()[index].take().is_some() {
                    tracing::info!(route, "Handler file is back to the serving version.");
                }
            }
            Outcome::Loaded(handler) => {
                let (cached, _) = handler.load_stats();
                let (name, new_version) =
                    (handler.name().to_string(), handler.version().to_string());
                // The old version lives on in the calls still running on it.
                let old = target.slot.swap(handler);
                self.errors.lock().unwrap()[index] = None;
                self.telemetry.emit(events::HandlerReloaded {
                    route: route.clone(),
                    handler: name,
                    old_version: old.version().to_string(),
                    new_version,
                    took: first_event.map(|t| t.elapsed()).unwrap_or_default(),
                    cached,
                });
            }
            Outcome::SameFailure => {}
            Outcome::Failed(error, content) => {
                self.pending[index].failed = content;
                let error = error.to_string();
                self.errors.lock().unwrap()[index] = Some(error.clone());
                self.telemetry.emit(events::HandlerReloadFailed {
                    route: route.clone(),
                    version: target.slot.current().version().to_string(),
                    error,
                });
            }
        }
    }
}

/// The most bytes a reload reads from a handler file (a Python component
/// is 18-35 MB).
pub const MAX_HANDLER_BYTES: u64 = 256 << 20;

/// Reads a handler file for a reload, safely: it must resolve, through any
/// links, to a regular file inside the handler's own directory (a
/// Kubernetes ConfigMap's `NAME -> ..data/NAME -> ..2026_../NAME` does), of
/// at most [`MAX_HANDLER_BYTES`]. So a link swapped to `/dev/zero`, a FIFO
/// or a file elsewhere is refused by name, and the serving version stays.
pub fn read_handler(handler: &Path) -> std::io::Result<Vec<u8>> {
    // A Kubernetes rollout renames `..data` to the new directory and then
    // removes the old one: a read that was following the old name may find
    // it gone. While the handler's own name is there, follow it again, a
    // little later each time.
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match read_resolved(handler) {
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && attempts < 10
                    && std::fs::symlink_metadata(handler).is_ok() =>
            {
                std::thread::sleep(std::time::Duration::from_micros(100 << attempts.min(6)));
            }
            result => return result,
        }
    }
}

/// One attempt of [`read_handler`].
fn read_resolved(handler: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Read as _};
    let real = handler.canonicalize()?;
    let dir = match handler.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.canonicalize()?,
        _ => std::env::current_dir()?,
    };
    if !real.starts_with(&dir) {
        return Err(Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "it resolves to {}, outside its directory {}: a link may point only within it",
                real.display(),
                dir.display()
            ),
        ));
    }
    let metadata = std::fs::metadata(&real)?;
    if !metadata.is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{} is not a regular file", real.display()),
        ));
    }
    if metadata.len() > MAX_HANDLER_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "it is {} bytes, more than the {MAX_HANDLER_BYTES} a handler may have",
                metadata.len()
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    std::fs::File::open(&real)?
        .take(MAX_HANDLER_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_HANDLER_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("it grew past the {MAX_HANDLER_BYTES} bytes a handler may have"),
        ));
    }
    Ok(bytes)
}

/// Reads the file and, when it is neither the serving version nor the
/// content that failed last, loads it.
fn load(runtime: &Runtime, route: &Route, serving: &str, failed: Option<&str>) -> Outcome {
    let bytes = match read_handler(&route.handler) {
        Ok(bytes) => bytes,
        Err(source) => {
            let error = LoadError::Read {
                path: route.handler.clone(),
                source,
            };
            return Outcome::Failed(error, None);
        }
    };
    let version = crate::plugin::version_of(&bytes);
    if version == serving {
        return Outcome::Unchanged;
    }
    if failed == Some(version.as_str()) {
        return Outcome::SameFailure;
    }
    match runtime.load_bytes(&route.handler, &bytes, route) {
        Ok(handler) => Outcome::Loaded(handler),
        Err(e) => Outcome::Failed(e, Some(version)),
    }
}
