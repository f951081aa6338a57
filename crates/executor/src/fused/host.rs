//! Host emulation of a fused launch: the generated kernel's own source run on CPU threads
//! (`kernels/host/`: a CTA a forked process, its threads fibers), so that a layer's parts
//! and the step are checked in CI, without a GPU, by the code the GPU runs.
//!
//! Device memory is one [`HostImage`] mapped by the driver at a fixed address ([`HOST_BASE`]), so
//! the host writes real pointers into the stages' argument structs and the task table, and the
//! driver passes the structs to the kernel as their bytes: one generated driver serves every
//! combination of stages. The driver is built with g++ (C++20) once per source and cached.

use super::{CtaShape, ENTRY};
use device::{DeviceError, KernelSource, HOST_LAUNCH, HOST_PRELUDE};
use mailbox::gpu::LaunchTable;
use mailbox::layout::Tags;
use mailbox::{StageKernel, ValidPlacement, DIAG_WORDS};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the driver maps the image: high enough to be free in a 47-bit address space's middle.
pub const HOST_BASE: u64 = 0x2000_0000_0000;
/// `emu_launch`'s status when no CTA made progress (`kernels/host/launch.h`).
const EMU_STALLED: i32 = 3;
/// Alignment of every allocation in the image.
const ALIGN: u64 = 256;
/// The line of the fused source a CPU thread cannot take: dynamic shared memory.
const DYNAMIC_LDS: &str = "extern __shared__ __attribute__((aligned(1024))) u8 mono_lds[];";

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("the fused source: {0}")]
    Source(String),
    #[error("g++ (C++20) is needed to emulate a launch on CPU threads: {0}")]
    NoCompiler(String),
    #[error("g++ failed on the host driver of `{name}`:\n{log}")]
    Compile { name: String, log: String },
    #[error("{what}: {err}")]
    Io { what: String, err: std::io::Error },
    #[error("stage arguments: {given} given for {stages} stages")]
    Arguments { given: usize, stages: usize },
    #[error("the emulated launch failed (status {status}): {log}")]
    Failed { status: i32, log: String },
    #[error("the emulated launch stalled: task {task} waited on box {box_index} (CTA {cta})")]
    Stalled { task: u32, box_index: u32, cta: u32 },
    #[error("no CTA passed a barrier for {seconds} s: a wait that never ends (a hand-off never made, or a placement the rule refuses){log}")]
    NoProgress { seconds: u32, log: String },
    #[error("the image has no {len} bytes at {address:#x}")]
    OutOfImage { address: u64, len: u64 },
    #[error("tags: {0}")]
    Tags(String),
}

pub type Result<T, E = HostError> = std::result::Result<T, E>;

/// The device memory of an emulated launch: bytes at [`HOST_BASE`].
#[derive(Clone, Debug, Default)]
pub struct HostImage {
    bytes: Vec<u8>,
}

impl HostImage {
    pub fn new() -> Self {
        Self::default()
    }

    /// Copies `data` in; returns its device address.
    pub fn put(&mut self, data: &[u8]) -> u64 {
        let at = (self.bytes.len() as u64).next_multiple_of(ALIGN);
        self.bytes.resize(at as usize, 0);
        self.bytes.extend_from_slice(data);
        HOST_BASE + at
    }

    /// `bytes` zeroed bytes; their device address.
    pub fn zeroed(&mut self, bytes: u64) -> u64 {
        let at = (self.bytes.len() as u64).next_multiple_of(ALIGN);
        self.bytes.resize((at + bytes) as usize, 0);
        HOST_BASE + at
    }

    pub fn read(&self, address: u64, len: u64) -> Result<&[u8]> {
        let range = self.range(address, len)?;
        Ok(&self.bytes[range])
    }

    pub fn write(&mut self, address: u64, data: &[u8]) -> Result<()> {
        let range = self.range(address, data.len() as u64)?;
        self.bytes[range].copy_from_slice(data);
        Ok(())
    }

    fn range(&self, address: u64, len: u64) -> Result<std::ops::Range<usize>> {
        let start = address.checked_sub(HOST_BASE);
        match start {
            Some(s) if s + len <= self.bytes.len() as u64 => Ok(s as usize..(s + len) as usize),
            _ => Err(HostError::OutOfImage { address, len }),
        }
    }

    /// The task table of `placement`, a zeroed scratch of `boxes`, the epoch word and the
    /// diagnostics, put into the image: launch `launch_index` of a step of `tags` at `epoch`.
    pub fn launch_table(
        &mut self,
        placement: &ValidPlacement,
        boxes: u32,
        tags: Tags,
        launch_index: u32,
        epoch: u32,
    ) -> Result<LaunchTable> {
        let table = placement.placement().table();
        let tasks = self.put(bytemuck::cast_slice(&table.tasks));
        let offsets = self.put(bytemuck::cast_slice(&table.offsets));
        let scratch = self.zeroed(u64::from(boxes.max(1)) * 8);
        let epoch_word = self.put(&epoch.to_le_bytes());
        let diag = self.zeroed(DIAG_WORDS as u64 * 4);
        tags.tag(epoch, launch_index)
            .map_err(|e| HostError::Tags(e.to_string()))?;
        Ok(LaunchTable {
            tasks,
            offsets,
            scratch,
            epoch: epoch_word,
            diag,
            trace: 0,
            n_ctas: placement.placement().ctas(),
            launches_per_step: tags.launches_per_step(),
            launch_index,
            pad: 0,
        })
    }
}

/// A fused kernel built to run on CPU threads.
#[derive(Debug)]
pub struct HostKernel {
    exe: PathBuf,
    stages: usize,
}

impl HostKernel {
    /// Builds (or finds in the cache) the host driver of `source`, a fused kernel generated by
    /// [`super::fused_source`] for `stages` in `shape`.
    pub fn build(source: &KernelSource, stages: &[StageKernel], shape: CtaShape) -> Result<Self> {
        let text = source.text();
        if !text.contains(DYNAMIC_LDS) {
            return Err(HostError::Source(format!(
                "`{}` does not declare the fused kernel's dynamic shared memory",
                source.name()
            )));
        }
        let kernel = text.replace(
            DYNAMIC_LDS,
            &format!("alignas(1024) static u8 mono_lds[{}];", shape.shared_bytes),
        );
        let kernel_name = source.name().to_owned();
        let wrapped = source
            .clone()
            .with_text(kernel)
            .define("MBX_DEBUG", 1)
            .define("MBX_DEBUG_TRAP", 0)
            .wrap("driver.cpp", driver_text(&kernel_name, stages))
            .header(HOST_PRELUDE.0, HOST_PRELUDE.1)
            .header(HOST_LAUNCH.0, HOST_LAUNCH.1);
        let flat = wrapped
            .flatten()
            .map_err(|e| HostError::Source(e.to_string()))?;
        let mut key = Sha256::new();
        key.update(flat.as_bytes());
        for (k, v) in wrapped.defines() {
            key.update(format!("-D{k}={v}\n").as_bytes());
        }
        let hash: String = key.finalize()[..12]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let dir = device::ModuleCache::default_location()
            .dir()
            .join("host")
            .join(&hash);
        let exe = dir.join("driver");
        if !exe.exists() {
            compile(&dir, &flat, wrapped.defines(), &exe, &kernel_name)?;
        }
        Ok(HostKernel {
            exe,
            stages: stages.len(),
        })
    }

    /// Runs one launch over `image`: `table` from [`HostImage::launch_table`], `args` the stages'
    /// argument structs as bytes, in the order of the stages the kernel was built for. A launch
    /// with no progress for `stall_seconds` (no barrier passed in any CTA) is stopped.
    pub fn run(
        &self,
        image: &mut HostImage,
        table: &LaunchTable,
        args: &[&[u8]],
        stall_seconds: u32,
    ) -> Result<()> {
        if args.len() != self.stages {
            return Err(HostError::Arguments {
                given: args.len(),
                stages: self.stages,
            });
        }
        let dir = tempdir()?;
        let input = dir.join("in.bin");
        let output = dir.join("out.bin");
        let mut bytes = Vec::new();
        for word in [HOST_BASE, image.bytes.len() as u64, args.len() as u64] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.extend_from_slice(bytemuck::bytes_of(table));
        for a in args {
            bytes.extend_from_slice(&(a.len() as u64).to_le_bytes());
            bytes.extend_from_slice(a);
        }
        bytes.extend_from_slice(&image.bytes);
        write(&input, &bytes)?;
        let out = Command::new(&self.exe)
            .arg(&input)
            .arg(&output)
            .arg(stall_seconds.to_string())
            .output()
            .map_err(|err| HostError::Io {
                what: format!("running {}", self.exe.display()),
                err,
            })?;
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        let after = std::fs::read(&output).map_err(|err| HostError::Io {
            what: format!("reading {}", output.display()),
            err,
        });
        let _ = std::fs::remove_dir_all(&dir);
        let diag = |after: &[u8]| -> Option<[u32; 4]> {
            let at = table.diag.checked_sub(HOST_BASE)? as usize;
            let words = after.get(at..at + 16)?;
            let w = |i: usize| {
                u32::from_le_bytes([
                    words[4 * i],
                    words[4 * i + 1],
                    words[4 * i + 2],
                    words[4 * i + 3],
                ])
            };
            Some([w(0), w(1), w(2), w(3)])
        };
        if let Ok(after) = &after {
            if after.len() == image.bytes.len() {
                if let Some([stalled, task, box_index, cta]) = diag(after) {
                    if stalled != 0 {
                        return Err(HostError::Stalled {
                            task,
                            box_index,
                            cta,
                        });
                    }
                }
            }
        }
        let status = out.status.code().unwrap_or(-1);
        if status == EMU_STALLED {
            return Err(HostError::NoProgress {
                seconds: stall_seconds,
                log,
            });
        }
        if status != 0 {
            return Err(HostError::Failed { status, log });
        }
        image.bytes = after?;
        Ok(())
    }
}

/// The driver: maps the image at its address, reads the launch table and the stages' argument
/// structs as bytes, runs the launch on CPU threads, writes the image back.
fn driver_text(kernel: &str, stages: &[StageKernel]) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "#include \"{kernel}\"\n#include \"launch.h\"");
    t.push_str(
        r#"#include <cstdio>
#include <cstring>
#include <sys/mman.h>

static void read_bytes(FILE* f, void* dst, size_t n) {
  if (fread(dst, 1, n, f) != n) { fprintf(stderr, "short input\n"); exit(2); }
}
template <class T>
static void read_arg(FILE* f, T* arg) {
  u64 size;
  read_bytes(f, &size, 8);
  if (size != sizeof(T)) { fprintf(stderr, "an argument struct of %llu bytes; the kernel's is %zu\n", size, sizeof(T)); exit(2); }
  read_bytes(f, arg, sizeof(T));
}

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  u64 head[3];
  read_bytes(f, head, sizeof head);
  const u64 base = head[0], bytes = head[1] > 0 ? head[1] : 1;
  void* image = mmap((void*)base, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (image != (void*)base) { fprintf(stderr, "the image cannot be mapped at %#llx\n", base); return 2; }
  mbx_launch l;
  read_bytes(f, &l, sizeof l);
"#,
    );
    for (i, s) in stages.iter().enumerate() {
        let _ = writeln!(t, "  {} a{i};\n  read_arg(f, &a{i});", s.args_type);
    }
    let params: Vec<String> = (0..stages.len()).map(|i| format!("a{i}")).collect();
    let _ = write!(
        t,
        r#"  read_bytes(f, image, head[1]);
  fclose(f);
  const int status = emu_launch(l.n_ctas, MONO_CTA_THREADS, [&] {{ {ENTRY}(l, {}); }}, (u32)atoi(argv[3]));
  if (l.diag[0]) fprintf(stderr, "stall: task %u box %u cta %u\n", l.diag[1], l.diag[2], l.diag[3]);
  FILE* o = fopen(argv[2], "wb");
  if (!o) return 2;
  fwrite(image, 1, head[1], o);
  fclose(o);
  return status != 0 ? status : l.diag[0] ? 4 : 0;
}}
"#,
        params.join(", ")
    );
    t
}

fn compile(
    dir: &Path,
    flat: &str,
    defines: &std::collections::BTreeMap<String, String>,
    exe: &Path,
    name: &str,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|err| HostError::Io {
        what: format!("creating {}", dir.display()),
        err,
    })?;
    device::host::compile_unit(name, flat, defines, exe)
        .map(|_| ())
        .map_err(|e| match e {
            DeviceError::Compile { log, .. } => HostError::Compile {
                name: name.to_owned(),
                log,
            },
            other => HostError::NoCompiler(other.to_string()),
        })
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|err| HostError::Io {
        what: format!("writing {}", path.display()),
        err,
    })
}

fn tempdir() -> Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("mono-host-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|err| HostError::Io {
        what: format!("creating {}", dir.display()),
        err,
    })?;
    Ok(dir)
}
