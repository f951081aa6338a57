//! On-disk cache of compiled modules, keyed by a SHA-256 of (flattened source, defines, target,
//! compiler version): a second build of the same kernel loads the image instead of compiling.

use crate::compile::{Compiled, Compiler};
use crate::error::{DeviceError, Result};
use crate::resources::KernelResources;
use crate::source::KernelSource;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How a module was obtained: compiled now, or read from the cache.
#[derive(Clone, Debug)]
pub struct BuildReport {
    pub key: String,
    pub cached: bool,
    pub millis: f64,
}

#[derive(Clone, Debug)]
pub struct ModuleCache {
    dir: PathBuf,
}

impl ModuleCache {
    /// `$MONO_CACHE`, else `$XDG_CACHE_HOME/monokernel`, else `~/.cache/monokernel`.
    pub fn default_location() -> Self {
        let dir = std::env::var_os("MONO_CACHE")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("monokernel"))
            })
            .or_else(|| {
                std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/monokernel"))
            })
            .unwrap_or_else(|| std::env::temp_dir().join("monokernel-cache"));
        ModuleCache { dir }
    }

    pub fn at(dir: impl Into<PathBuf>) -> Self {
        ModuleCache { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn key(source: &KernelSource, compiler: &dyn Compiler) -> Result<String> {
        let mut hash = Sha256::new();
        for part in [
            source.flatten()?.as_str(),
            compiler.target(),
            compiler.version(),
        ] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part.as_bytes());
        }
        for (k, v) in source.defines() {
            hash.update(format!("-D{k}={v}\n").as_bytes());
        }
        Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Loads the image from the cache, or compiles and stores it.
    pub fn build(
        &self,
        source: &KernelSource,
        compiler: &dyn Compiler,
    ) -> Result<(Compiled, BuildReport)> {
        let start = Instant::now();
        let key = Self::key(source, compiler)?;
        let image_path = self.dir.join(format!("{key}.bin"));
        let report_path = self.dir.join(format!("{key}.json"));
        if let (Ok(image), Ok(json)) = (std::fs::read(&image_path), std::fs::read(&report_path)) {
            if let Ok(resources) = serde_json::from_slice::<Vec<KernelResources>>(&json) {
                let report = BuildReport {
                    key,
                    cached: true,
                    millis: start.elapsed().as_secs_f64() * 1e3,
                };
                let log = String::new();
                return Ok((
                    Compiled {
                        image,
                        resources,
                        log,
                    },
                    report,
                ));
            }
        }
        let compiled = compiler.compile(source)?;
        self.store(&image_path, &compiled.image)?;
        let json = serde_json::to_vec_pretty(&compiled.resources).unwrap_or_default();
        self.store(&report_path, &json)?;
        let report = BuildReport {
            key,
            cached: false,
            millis: start.elapsed().as_secs_f64() * 1e3,
        };
        Ok((compiled, report))
    }

    /// Write to a temporary name and rename, so a reader never sees half a file; the name is the
    /// writer's own (process and call), as threads may store the same key at once.
    fn store(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let err = |source| DeviceError::Cache {
            path: path.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(err)?;
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
        std::fs::write(&tmp, bytes).map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)
    }
}
