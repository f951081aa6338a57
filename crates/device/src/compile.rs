//! Compilers from our one HIP-dialect source to a loadable image: NVRTC (NVIDIA cubin) and clang
//! (AMD code object). Both work without a GPU, so CI builds every kernel for both targets.

use crate::error::{DeviceError, Result};
use crate::resources::{parse_clang_remarks, parse_ptxas_log, KernelResources};
use crate::source::KernelSource;
use std::ffi::CString;
use std::path::PathBuf;
use std::process::Command;

/// What a compiler produced: the image to load and the per-kernel resource report.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub image: Vec<u8>,
    pub resources: Vec<KernelResources>,
    /// The compiler's messages (warnings, the resource report); empty when read from the cache.
    pub log: String,
}

/// A compiler for one target architecture.
pub trait Compiler: Send + Sync {
    /// `sm_90a`, `gfx950`, ...
    fn target(&self) -> &str;
    /// Goes into the cache key, so a new compiler never reuses an old image.
    fn version(&self) -> &str;
    fn compile(&self, source: &KernelSource) -> Result<Compiled>;
}

/// NVRTC, loaded at run time (libnvrtc.so from CUDA or the `nvidia-cuda-nvrtc` wheel).
pub struct Nvrtc {
    target: String,
    version: String,
}

impl Nvrtc {
    /// `target` is an `sm_XX[a]` name. Fails with a clear error when libnvrtc cannot be loaded.
    pub fn new(target: &str) -> Result<Self> {
        // cudarc panics on first use when the library is missing: probe first.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(DeviceError::NoCompiler {
                compiler: "NVRTC",
                detail: "libnvrtc.so could not be loaded. Install CUDA 13, or `pip install \
                         nvidia-cuda-nvrtc==13.0.*` and add its nvidia/cu13/lib folder to LD_LIBRARY_PATH"
                    .into(),
            });
        }
        let (mut major, mut minor) = (0, 0);
        unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| DeviceError::NoCompiler {
                compiler: "NVRTC",
                detail: format!("nvrtcVersion failed: {e:?}"),
            })?;
        Ok(Nvrtc {
            target: target.to_string(),
            version: format!("nvrtc {major}.{minor}"),
        })
    }
}

impl Compiler for Nvrtc {
    fn target(&self) -> &str {
        &self.target
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn compile(&self, source: &KernelSource) -> Result<Compiled> {
        use cudarc::nvrtc::{result, sys};
        let flat = source.flatten()?;
        let fail = |log: String| DeviceError::Compile {
            kernel: source.name().to_string(),
            target: self.target.clone(),
            log,
        };
        let text = CString::new(flat).map_err(|_| fail("source contains a NUL byte".into()))?;
        let name =
            CString::new(source.name()).map_err(|_| fail("name contains a NUL byte".into()))?;
        let mut options = vec![
            format!("--gpu-architecture={}", self.target),
            "-std=c++17".to_string(),
            "--ptxas-options=-v".to_string(),
            // Line tables only: the same instructions (SASS compared kernel by kernel), and a
            // disassembler or profiler can name the source line of each.
            "--generate-line-info".to_string(),
        ];
        options.extend(source.defines().iter().map(|(k, v)| format!("-D{k}={v}")));

        // One compile at a time: on the H200 image, concurrent compiles lost the ptxas -v lines of
        // one program (its resource report came back empty).
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let program =
            result::create_program(&text, Some(&name)).map_err(|e| fail(format!("{e:?}")))?;
        let compiled = unsafe { result::compile_program(program, &options) };
        let log = unsafe { result::get_program_log(program) }
            .map(|chars| c_chars_to_string(&chars))
            .unwrap_or_default();
        let image = compiled.map_err(|_| fail(log.clone())).and_then(|()| {
            let mut size = 0usize;
            unsafe { sys::nvrtcGetCUBINSize(program, &mut size) }
                .result()
                .map_err(|e| fail(format!("nvrtcGetCUBINSize: {e:?}")))?;
            let mut image = vec![0u8; size];
            unsafe { sys::nvrtcGetCUBIN(program, image.as_mut_ptr().cast()) }
                .result()
                .map_err(|e| fail(format!("nvrtcGetCUBIN: {e:?}")))?;
            Ok(image)
        });
        let _ = unsafe { result::destroy_program(program) };
        Ok(Compiled {
            image: image?,
            resources: parse_ptxas_log(&log),
            log,
        })
    }
}

fn c_chars_to_string(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// clang in HIP mode with no ROCm headers or device libraries: a code object for hipModuleLoadData.
pub struct Clang {
    path: PathBuf,
    target: String,
    version: String,
}

impl Clang {
    /// Finds `$MONO_CLANG`, else `clang-22`, `clang`, `amdclang++` on the PATH.
    pub fn find(target: &str) -> Result<Self> {
        let candidates: Vec<PathBuf> = match std::env::var_os("MONO_CLANG") {
            Some(path) => vec![PathBuf::from(path)],
            None => ["clang-22", "clang", "amdclang++"]
                .iter()
                .map(PathBuf::from)
                .collect(),
        };
        for path in &candidates {
            let Ok(out) = Command::new(path).arg("--version").output() else {
                continue;
            };
            let first = String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string();
            if out.status.success() && first.contains("clang") {
                return Ok(Clang {
                    path: path.clone(),
                    target: target.to_string(),
                    version: first,
                });
            }
        }
        Err(DeviceError::NoCompiler {
            compiler: "clang",
            detail: format!(
                "none of {} runs; install clang-22 and lld-22 (Debian: `apt-get install clang-22 lld-22`) \
                 or set MONO_CLANG",
                candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        })
    }
}

impl Compiler for Clang {
    fn target(&self) -> &str {
        &self.target
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn compile(&self, source: &KernelSource) -> Result<Compiled> {
        let flat = source.flatten()?;
        let dir = scratch_dir()?;
        let input = dir.join("kernel.hip");
        let output = dir.join("kernel.co");
        let io = |e| DeviceError::Cache {
            path: dir.clone(),
            source: e,
        };
        std::fs::write(&input, flat).map_err(io)?;
        let mut cmd = Command::new(&self.path);
        cmd.args(["-x", "hip", "-std=c++17", "-O3", "-nogpulib", "-nogpuinc"])
            .args(["--cuda-device-only", "--no-gpu-bundle-output"])
            .arg(format!("--offload-arch={}", self.target))
            // LDS holds only what a kernel declares: clang would otherwise move private arrays
            // into LDS, changing occupancy (and the persistent grid) behind the kernel's back.
            .args(["-mllvm", "-disable-promote-alloca-to-lds"])
            .arg("-Rpass-analysis=kernel-resource-usage")
            // As NVRTC's line info: the same instructions, each with its source line.
            .arg("-gline-tables-only")
            .args(source.defines().iter().map(|(k, v)| format!("-D{k}={v}")))
            .arg("-o")
            .arg(&output)
            .arg(&input);
        let out = cmd.output().map_err(io)?;
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        let result = if out.status.success() {
            std::fs::read(&output).map_err(io).map(|image| Compiled {
                image,
                resources: parse_clang_remarks(&log),
                log,
            })
        } else {
            Err(DeviceError::Compile {
                kernel: source.name().to_string(),
                target: self.target.clone(),
                log,
            })
        };
        let _ = std::fs::remove_dir_all(&dir);
        result
    }
}

fn scratch_dir() -> Result<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "mono-clang-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|source| DeviceError::Cache {
        path: dir.clone(),
        source,
    })?;
    Ok(dir)
}

/// The compiler for `target`: clang for `gfx*`, NVRTC for `sm_*`.
pub fn compiler_for(target: &str) -> Result<Box<dyn Compiler>> {
    if target.starts_with("gfx") {
        Ok(Box::new(Clang::find(target)?))
    } else {
        Ok(Box::new(Nvrtc::new(target)?))
    }
}

/// Whether a missing compiler must fail a build check (`MONO_REQUIRE_COMPILERS=1`, as CI sets it).
pub fn compilers_required() -> bool {
    std::env::var("MONO_REQUIRE_COMPILERS").is_ok_and(|v| v == "1")
}

/// For build checks: the compiler for `target`, `Ok(None)` when it is missing and not required
/// (a skipped check, counted in the summary at exit: [`crate::record_skipped_check`]), an error
/// when it is missing and required.
pub fn optional_compiler(target: &str) -> Result<Option<Box<dyn Compiler>>> {
    match compiler_for(target) {
        Ok(c) => Ok(Some(c)),
        Err(e) if !compilers_required() => {
            crate::record_skipped_check(target, &e);
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
