//! The host backend: a device emulated on CPU threads, so that the code that drives a GPU (its
//! buffers, launches, graphs) runs unchanged on a machine without one, with the kernels' own
//! source (`kernels/host/`: a CTA a forked process, its threads fibers).
//!
//! Device memory is one image of bytes at [`HOST_BASE`], so pointers written into kernel
//! arguments and task tables are real addresses in the driver process, which maps the image
//! there. A module is an executable built by g++ from the flattened source with the host prelude
//! and a generated `main` that runs one launch of any of its kernels: it reads the image and the
//! arguments, runs the CTAs, writes the image back. Streams are synchronous; a captured graph is
//! the list of its launches, replayed in order.

use crate::backend::{Backend, DeviceInfo, Handle, Launch};
use crate::compile::{Compiled, Compiler};
use crate::error::{DeviceError, Result};
use crate::resources::KernelResources;
use crate::source::{KernelSource, HOST_LAUNCH, HOST_PRELUDE};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

/// Where the image lives in the driver's address space.
pub const HOST_BASE: u64 = 0x2000_0000_0000;
/// The most device memory the host backend hands out.
const CAPACITY: u64 = 16 << 30;
const ALIGN: u64 = 256;
/// Dynamic shared memory a host CTA has (the most a launch may ask for).
const SHARED_BYTES: u32 = 227 * 1024;
/// A launch with no barrier passed in any CTA for this long is stopped.
const STALL_SECONDS: u32 = 60;

/// The most CTAs a host device emulates: each is a process of its own.
pub const MAX_HOST_CTAS: u32 = 256;

/// Emulated CTAs (the "multiprocessors") that `MONO_HOST_CTAS` asks for, if it is set to a
/// count the host device takes.
pub fn ctas_from_env() -> Option<u32> {
    std::env::var("MONO_HOST_CTAS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| (1..=MAX_HOST_CTAS).contains(&n))
}

fn host_error(call: &'static str, message: impl Into<String>) -> DeviceError {
    DeviceError::Driver {
        backend: "host",
        call,
        message: message.into(),
    }
}

#[derive(Clone)]
enum Work {
    Launch {
        function: Handle,
        launch: Launch,
        params: Vec<Vec<u8>>,
    },
    Memset {
        ptr: u64,
        byte: u8,
        bytes: usize,
    },
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
}

#[derive(Default)]
struct State {
    image: Vec<u8>,
    modules: Vec<Option<PathBuf>>,
    functions: Vec<(Handle, String)>,
    capturing: HashMap<Handle, Vec<Work>>,
    graphs: Vec<Option<Vec<Work>>>,
    events: Vec<Option<Instant>>,
    next_stream: Handle,
}

pub(crate) struct Host {
    info: DeviceInfo,
    compiler: HostCompiler,
    state: Mutex<State>,
}

impl Host {
    pub(crate) fn open(ctas: u32) -> Result<Self> {
        if !(1..=MAX_HOST_CTAS).contains(&ctas) {
            return Err(host_error(
                "open",
                format!("{ctas} CTAs asked for; a host device emulates 1 to {MAX_HOST_CTAS}"),
            ));
        }
        let compiler = HostCompiler::new()?;
        let info = DeviceInfo {
            backend: "host",
            name: "CPU threads (host emulation)".into(),
            arch: "host".into(),
            ordinal: 0,
            multiprocessors: ctas,
            total_memory: CAPACITY as usize,
            wave_size: 32,
            max_shared_per_block: SHARED_BYTES,
            clock_khz: 0,
            memory_clock_khz: 0,
            memory_bus_bits: 0,
            l2_bytes: 0,
            driver_version: compiler.version.clone(),
        };
        Ok(Host {
            info,
            compiler,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn range(image: &[u8], ptr: u64, bytes: usize) -> Result<std::ops::Range<usize>> {
        let start = ptr.checked_sub(HOST_BASE).map(|s| s as usize);
        match start {
            Some(s) if s + bytes <= image.len() => Ok(s..s + bytes),
            _ => Err(host_error(
                "memory",
                format!("{bytes} bytes at {ptr:#x} are outside the device memory"),
            )),
        }
    }

    /// Runs `work` now, or records it when `stream` is capturing.
    fn submit(&self, stream: Handle, work: Work) -> Result<()> {
        let mut state = self.state();
        if let Some(list) = state.capturing.get_mut(&stream) {
            list.push(work);
            return Ok(());
        }
        self.run(&mut state, &work)
    }

    fn run(&self, state: &mut State, work: &Work) -> Result<()> {
        match work {
            Work::Memset { ptr, byte, bytes } => {
                let r = Self::range(&state.image, *ptr, *bytes)?;
                state.image[r].fill(*byte);
            }
            Work::Copy { dst, src, bytes } => {
                let s = Self::range(&state.image, *src, *bytes)?;
                let d = Self::range(&state.image, *dst, *bytes)?;
                state.image.copy_within(s, d.start);
            }
            Work::Launch {
                function,
                launch,
                params,
            } => self.run_launch(state, *function, *launch, params)?,
        }
        Ok(())
    }

    fn run_launch(
        &self,
        state: &mut State,
        function: Handle,
        launch: Launch,
        params: &[Vec<u8>],
    ) -> Result<()> {
        let (module, name) = state
            .functions
            .get(function)
            .cloned()
            .ok_or_else(|| host_error("launch", "no such function"))?;
        let exe = state
            .modules
            .get(module)
            .cloned()
            .flatten()
            .ok_or_else(|| host_error("launch", "the module was unloaded"))?;
        let dir = scratch_dir()?;
        let (input, output) = (dir.join("in.bin"), dir.join("out.bin"));
        let mut bytes = Vec::new();
        let head = [
            HOST_BASE,
            state.image.len() as u64,
            u64::from(launch.grid),
            u64::from(launch.block),
            u64::from(STALL_SECONDS),
            params.len() as u64,
        ];
        for w in head {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        for p in params {
            bytes.extend_from_slice(&(p.len() as u64).to_le_bytes());
            bytes.extend_from_slice(p);
        }
        bytes.extend_from_slice(&state.image);
        std::fs::write(&input, &bytes).map_err(|e| host_error("launch", e.to_string()))?;
        let out = Command::new(&exe)
            .arg(&name)
            .arg(&input)
            .arg(&output)
            .output()
            .map_err(|e| host_error("launch", format!("running {}: {e}", exe.display())));
        let after = std::fs::read(&output);
        let _ = std::fs::remove_dir_all(&dir);
        let out = out?;
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        match out.status.code() {
            Some(0) => {}
            Some(3) => {
                return Err(host_error(
                    "launch",
                    format!("{name}: no CTA passed a barrier for {STALL_SECONDS} s (a wait that never ends){log}"),
                ))
            }
            code => {
                return Err(host_error(
                    "launch",
                    format!("{name} failed (status {code:?}): {log}"),
                ))
            }
        }
        let after = after.map_err(|e| host_error("launch", e.to_string()))?;
        if after.len() != state.image.len() {
            return Err(host_error("launch", "the driver returned a short image"));
        }
        state.image = after;
        Ok(())
    }
}

impl Backend for Host {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn compiler(&self) -> &dyn Compiler {
        &self.compiler
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        let mut state = self.state();
        let at = (state.image.len() as u64).next_multiple_of(ALIGN);
        let end = at + (bytes as u64).max(1);
        if end > CAPACITY {
            return Err(host_error(
                "alloc",
                format!("{bytes} bytes more than the host device's {CAPACITY}"),
            ));
        }
        state.image.resize(end as usize, 0);
        Ok(HOST_BASE + at)
    }

    fn free(&self, _ptr: u64) {}

    fn memset(&self, ptr: u64, byte: u8, bytes: usize, stream: Handle) -> Result<()> {
        self.submit(stream, Work::Memset { ptr, byte, bytes })
    }

    fn copy_to_device(&self, dst: u64, src: &[u8], _stream: Handle) -> Result<()> {
        let mut state = self.state();
        let r = Self::range(&state.image, dst, src.len())?;
        state.image[r].copy_from_slice(src);
        Ok(())
    }

    fn copy_to_host(&self, dst: &mut [u8], src: u64, _stream: Handle) -> Result<()> {
        let state = self.state();
        let r = Self::range(&state.image, src, dst.len())?;
        dst.copy_from_slice(&state.image[r]);
        Ok(())
    }

    fn copy_on_device(&self, dst: u64, src: u64, bytes: usize, stream: Handle) -> Result<()> {
        self.submit(stream, Work::Copy { dst, src, bytes })
    }

    fn stream_create(&self) -> Result<Handle> {
        let mut state = self.state();
        state.next_stream += 1;
        Ok(state.next_stream)
    }

    fn stream_destroy(&self, stream: Handle) {
        self.state().capturing.remove(&stream);
    }

    fn stream_sync(&self, _stream: Handle) -> Result<()> {
        Ok(())
    }

    fn event_create(&self) -> Result<Handle> {
        let mut state = self.state();
        state.events.push(None);
        Ok(state.events.len() - 1)
    }

    fn event_destroy(&self, event: Handle) {
        if let Some(e) = self.state().events.get_mut(event) {
            *e = None;
        }
    }

    fn event_record(&self, event: Handle, _stream: Handle) -> Result<()> {
        let mut state = self.state();
        let slot = state
            .events
            .get_mut(event)
            .ok_or_else(|| host_error("event_record", "no such event"))?;
        *slot = Some(Instant::now());
        Ok(())
    }

    fn event_sync(&self, _event: Handle) -> Result<()> {
        Ok(())
    }

    fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32> {
        let state = self.state();
        let at = |e: Handle| state.events.get(e).copied().flatten();
        match (at(start), at(end)) {
            (Some(s), Some(e)) => Ok(e.saturating_duration_since(s).as_secs_f32() * 1e3),
            _ => Err(host_error("event_elapsed", "an event was never recorded")),
        }
    }

    fn module_load(&self, image: &[u8]) -> Result<Handle> {
        let dir = scratch_dir()?;
        let exe = dir.join("module");
        write_executable(&exe, image)?;
        let mut state = self.state();
        state.modules.push(Some(exe));
        Ok(state.modules.len() - 1)
    }

    fn module_unload(&self, module: Handle) {
        if let Some(Some(exe)) = self.state().modules.get_mut(module).map(Option::take) {
            if let Some(dir) = exe.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    fn function(&self, module: Handle, name: &str) -> Result<Handle> {
        let mut state = self.state();
        if !matches!(state.modules.get(module), Some(Some(_))) {
            return Err(host_error("function", "no such module"));
        }
        state.functions.push((module, name.to_owned()));
        Ok(state.functions.len() - 1)
    }

    fn function_resources(&self, _function: Handle) -> Result<KernelResources> {
        Ok(KernelResources::default())
    }

    fn set_max_dynamic_shared(&self, _function: Handle, _bytes: u32) -> Result<()> {
        Ok(())
    }

    fn max_active_per_multiprocessor(&self, _f: Handle, _block: u32, _shared: u32) -> Result<u32> {
        Ok(1)
    }

    unsafe fn launch(
        &self,
        function: Handle,
        launch: Launch,
        params: &mut [*mut c_void],
        sizes: &[usize],
        stream: Handle,
    ) -> Result<()> {
        let params = params
            .iter()
            .zip(sizes)
            .map(|(&p, &n)| std::slice::from_raw_parts(p as *const u8, n).to_vec())
            .collect();
        self.submit(
            stream,
            Work::Launch {
                function,
                launch,
                params,
            },
        )
    }

    fn begin_capture(&self, stream: Handle) -> Result<()> {
        self.state().capturing.insert(stream, Vec::new());
        Ok(())
    }

    fn end_capture(&self, stream: Handle) -> Result<(Handle, Handle)> {
        let mut state = self.state();
        let list = state
            .capturing
            .remove(&stream)
            .ok_or_else(|| host_error("end_capture", "the stream was not capturing"))?;
        state.graphs.push(Some(list));
        let g = state.graphs.len() - 1;
        Ok((g, g))
    }

    fn graph_launch(&self, exec: Handle, _stream: Handle) -> Result<()> {
        let mut state = self.state();
        let list = state
            .graphs
            .get(exec)
            .cloned()
            .flatten()
            .ok_or_else(|| host_error("graph_launch", "no such graph"))?;
        for work in &list {
            self.run(&mut state, work)?;
        }
        Ok(())
    }

    fn graph_upload(&self, _exec: Handle, _stream: Handle) -> Result<()> {
        Ok(())
    }

    fn graph_destroy(&self, graph: Handle, _exec: Handle) {
        if let Some(g) = self.state().graphs.get_mut(graph) {
            *g = None;
        }
    }
}

/// g++ (C++20): the source with the host prelude, its dynamic shared memory made static, and a
/// `main` that runs one launch of any of its kernels.
pub(crate) struct HostCompiler {
    version: String,
}

impl HostCompiler {
    fn new() -> Result<Self> {
        let out = Command::new("g++").arg("--version").output();
        let version = match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("g++")
                .to_owned(),
            _ => {
                return Err(DeviceError::NoCompiler {
                    compiler: "g++",
                    detail: "the host device builds kernels with g++ (C++20); install g++".into(),
                })
            }
        };
        // The module cache keys a build by the kernel's source and this version: the prelude, the
        // launcher and the driver's main are part of every module, so a change to them is too.
        let mut hash = Sha256::new();
        for part in [HOST_PRELUDE.1, HOST_LAUNCH.1, driver_main(&[]).as_str()] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part.as_bytes());
        }
        let digest: String = hash.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let version = format!("{version}; host prelude, launcher and driver {digest}");
        Ok(HostCompiler { version })
    }
}

impl Compiler for HostCompiler {
    fn target(&self) -> &str {
        "host"
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn compile(&self, source: &KernelSource) -> Result<Compiled> {
        let error = |message: String| DeviceError::Source {
            kernel: source.name().to_owned(),
            message,
        };
        let host = source
            .clone()
            .header(HOST_PRELUDE.0, HOST_PRELUDE.1)
            .header(HOST_LAUNCH.0, HOST_LAUNCH.1);
        let text = format!("{}\n#include \"launch.h\"\n", static_shared(host.text()));
        let flat = host.with_text(text).flatten()?;
        let kernels = kernel_signatures(&flat).map_err(error)?;
        let program = format!("{flat}\n{}", driver_main(&kernels));
        let dir = scratch_dir()?;
        let exe = dir.join("module");
        let built = compile_unit(source.name(), &program, source.defines(), &exe);
        let image = built.and_then(|log| {
            let image = std::fs::read(&exe).map_err(|e| error(e.to_string()))?;
            Ok((image, log))
        });
        let _ = std::fs::remove_dir_all(&dir);
        let (image, log) = image?;
        Ok(Compiled {
            image,
            resources: kernels
                .iter()
                .map(|k| KernelResources {
                    kernel: k.name.clone(),
                    ..Default::default()
                })
                .collect(),
            log,
        })
    }
}

/// Builds `exe`, an executable that runs a kernel's own source on CPU threads: `driver` (name,
/// text: a main file that includes the kernel's main file by its name, and `launch.h`) around
/// `source` (its headers and defines), with the host prelude in place of the real one and the
/// kernel's dynamic shared memory made static. The stages' host-emulation tests build their
/// drivers this way; the backend's modules and the fused launch's driver go through the same g++
/// step ([`compile_unit`]).
pub fn build_driver(source: &KernelSource, driver: (&str, &str), exe: &Path) -> Result<()> {
    let kernel = source.clone().with_text(static_shared(source.text()));
    let unit = kernel
        .header(HOST_PRELUDE.0, HOST_PRELUDE.1)
        .header(HOST_LAUNCH.0, HOST_LAUNCH.1)
        .wrap(driver.0, driver.1);
    let flat = unit.flatten()?;
    compile_unit(driver.0, &flat, unit.defines(), exe).map(|_| ())
}

/// g++ (C++20, threads) on one flattened unit `name` with its defines, into `exe`; the compiler's
/// log. The executable appears whole or not at all, so a build cut short is never taken for one.
pub fn compile_unit(
    name: &str,
    program: &str,
    defines: &std::collections::BTreeMap<String, String>,
    exe: &Path,
) -> Result<String> {
    let error = |message: String| DeviceError::Source {
        kernel: name.to_owned(),
        message,
    };
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let part = exe.with_extension(format!("{}-{n}.part", std::process::id()));
    let cpp = part.with_extension("cpp");
    std::fs::write(&cpp, program).map_err(|e| error(format!("{}: {e}", cpp.display())))?;
    let mut cmd = Command::new("g++");
    cmd.args(["-std=c++20", "-O1", "-pthread", "-w", "-x", "c++"]);
    for (k, v) in defines {
        cmd.arg(format!("-D{k}={v}"));
    }
    let out = cmd.arg(&cpp).arg("-o").arg(&part).output();
    let _ = std::fs::remove_file(&cpp);
    let out = out.map_err(|e| DeviceError::NoCompiler {
        compiler: "g++",
        detail: format!("host emulation builds kernels with g++ (C++20): {e}"),
    })?;
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        let _ = std::fs::remove_file(&part);
        return Err(DeviceError::Compile {
            kernel: name.to_owned(),
            target: "host".into(),
            log,
        });
    }
    std::fs::rename(&part, exe).map_err(|e| error(format!("{}: {e}", exe.display())))?;
    Ok(log)
}

/// `extern __shared__ [__attribute__((aligned(N)))] T name[];` as a static array of the most a
/// launch may ask for: a CTA is a process, so a static is the CTA's own.
fn static_shared(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("extern __shared__") {
            let decl = rest.trim().trim_end_matches(';').trim_end_matches("[]");
            let (align, decl) = match decl
                .strip_prefix("__attribute__((aligned(")
                .and_then(|r| r.split_once(")))"))
            {
                Some((n, d)) => (n.trim().to_owned(), d.trim()),
                None => ("16".to_owned(), decl.trim()),
            };
            let _ = writeln!(
                out,
                "alignas({align}) static {decl}[{SHARED_BYTES} / sizeof({})];",
                decl.rsplit_once(' ').map_or(decl, |(t, _)| t)
            );
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

struct KernelSig {
    name: String,
    params: Vec<String>,
}

/// Every `MONO_KERNEL void [__launch_bounds__(...)] name(params)` of the flattened source.
fn kernel_signatures(flat: &str) -> std::result::Result<Vec<KernelSig>, String> {
    let mut kernels = Vec::new();
    let mut rest = flat;
    while let Some(at) = rest.find("MONO_KERNEL void") {
        let after = &rest[at + "MONO_KERNEL void".len()..];
        let mut s = after.trim_start();
        if let Some(b) = s.strip_prefix("__launch_bounds__") {
            let close = b.find(')').ok_or("an unclosed __launch_bounds__")?;
            s = b[close + 1..].trim_start();
        }
        let open = s.find('(').ok_or("a kernel without parameters")?;
        let name = s[..open].trim().to_owned();
        let close = s[open..].find(')').ok_or("an unclosed parameter list")? + open;
        let params = s[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.rsplit_once(|c: char| c.is_whitespace() || c == '*')
                    .map(|(t, _)| {
                        let star = if p[t.len()..].starts_with('*') {
                            "*"
                        } else {
                            ""
                        };
                        format!("{}{star}", t.trim())
                    })
                    .ok_or_else(|| format!("a parameter `{p}` of {name} without a type"))
            })
            .collect::<std::result::Result<Vec<_>, String>>();
        // A mention in a comment is no declaration: only a name and typed parameters are.
        if let Ok(params) = params {
            if !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_') {
                kernels.push(KernelSig { name, params });
            }
        }
        rest = &s[close..];
    }
    Ok(kernels)
}

fn driver_main(kernels: &[KernelSig]) -> String {
    let mut t = String::from(
        r#"#include <cstdio>
#include <cstring>
#include <sys/mman.h>
static FILE* mono_in;
static void mono_read(void* dst, size_t n) {
  if (fread(dst, 1, n, mono_in) != n) { fprintf(stderr, "short input\n"); exit(2); }
}
template <class T>
static void mono_arg(T* arg) {
  u64 size;
  mono_read(&size, 8);
  if (size != (sizeof(T) + 7) / 8 * 8) { fprintf(stderr, "an argument of %llu bytes for one of %zu\n", size, sizeof(T)); exit(2); }
  u8 bytes[size];
  mono_read(bytes, size);
  memcpy((void*)arg, bytes, sizeof(T));
}
int main(int argc, char** argv) {
  if (argc != 4) return 2;
  mono_in = fopen(argv[2], "rb");
  if (!mono_in) return 2;
  u64 head[6];
  mono_read(head, sizeof head);
  const u64 base = head[0], bytes = head[1] > 0 ? head[1] : 1;
  void* image = mmap((void*)base, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (image != (void*)base) { fprintf(stderr, "the device memory cannot be mapped at %#llx\n", base); return 2; }
  const u32 grid = (u32)head[2], block = (u32)head[3], stall = (u32)head[4];
  int status = -1;
"#,
    );
    for k in kernels {
        let _ = writeln!(t, "  if (!strcmp(argv[1], \"{}\")) {{", k.name);
        for (i, p) in k.params.iter().enumerate() {
            let _ = writeln!(t, "    {p} p{i};\n    mono_arg(&p{i});");
        }
        let args: Vec<String> = (0..k.params.len()).map(|i| format!("p{i}")).collect();
        let _ = writeln!(
            t,
            "    mono_read(image, head[1]);\n    status = emu_launch(grid, block, [&] {{ {}({}); }}, stall);\n  }}",
            k.name,
            args.join(", ")
        );
    }
    t.push_str(
        r#"  if (status < 0) { fprintf(stderr, "no kernel %s in this module\n", argv[1]); return 2; }
  FILE* o = fopen(argv[3], "wb");
  if (!o) return 2;
  fwrite(image, 1, head[1], o);
  fclose(o);
  return status;
}
"#,
    );
    t
}

/// A scratch directory of this process: `mono-host-<pid>-<n>` in the system's temporary directory.
/// The first one a process makes clears the ones that processes no longer running left behind: a
/// launch's directory holds the whole device image (gigabytes at a large preset), and a run that
/// was killed never removed it.
fn scratch_dir() -> Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if n == 0 {
        remove_orphaned_scratch(&std::env::temp_dir());
    }
    let dir = std::env::temp_dir().join(format!("mono-host-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| host_error("scratch", e.to_string()))?;
    Ok(dir)
}

/// The pid a scratch directory's name holds, if it is one.
fn scratch_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("mono-host-")?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// Removes the scratch directories in `root` whose process is gone (Linux: no `/proc/<pid>`;
/// elsewhere nothing is removed). Best effort: a directory that cannot be removed stays.
fn remove_orphaned_scratch(root: &Path) {
    let proc = Path::new("/proc");
    if !proc.join("self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(scratch_owner) else {
            continue;
        };
        if !proc.join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn write_executable(path: &Path, image: &[u8]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, image).map_err(|e| host_error("module_load", e.to_string()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| host_error("module_load", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_names_give_their_pid() {
        assert_eq!(scratch_owner("mono-host-123-4"), Some(123));
        assert_eq!(scratch_owner("mono-host-123"), None);
        assert_eq!(scratch_owner("mono-host-x-4"), None);
        assert_eq!(scratch_owner("mono-cache"), None);
    }

    #[test]
    fn scratch_of_a_finished_process_is_removed_and_a_running_ones_kept() {
        if !Path::new("/proc/self").exists() {
            return;
        }
        let root = std::env::temp_dir().join(format!("mono-scratch-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        // A pid that was a process and has ended: a child waited on.
        let mut child = Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let orphan = root.join(format!("mono-host-{dead}-0"));
        let own = root.join(format!("mono-host-{}-7", std::process::id()));
        let other = root.join("mono-host-notes");
        for d in [&orphan, &own, &other] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("image"), [0u8; 16]).unwrap();
        }
        remove_orphaned_scratch(&root);
        let (orphan_left, own_left, other_left) = (orphan.exists(), own.exists(), other.exists());
        let _ = std::fs::remove_dir_all(&root);
        assert!(!orphan_left, "a finished process's scratch stays");
        assert!(own_left && other_left);
    }
}
