//! Kernel sources: a `.hip` file, the headers it includes by quoted name, and its `-D` defines.
//! Sources are flattened into one text before compiling, so that the cache key covers every header.

use crate::error::{DeviceError, Result};
use std::collections::{BTreeMap, BTreeSet};

/// The platform prelude every kernel may include as `"prelude.h"`.
pub const PRELUDE: (&str, &str) = ("prelude.h", include_str!("../../../kernels/prelude.h"));
/// bf16/FP8 conversions and wave reductions, included by the prelude.
pub const NUMERICS: (&str, &str) = ("numerics.h", include_str!("../../../kernels/numerics.h"));
/// The ops layer, by scope: teams and their barriers (`ops/team.h`), asynchronous copies into LDS
/// (`ops/copy.h`), wave-scope matrix instructions (`ops/warp_mma.h`: mma.sync, MFMA),
/// warpgroup-scope ones with their shared-memory descriptors (`ops/warpgroup_mma.h`: wgmma), and
/// the weight-streaming linear tile (`ops/linear.h`), rope at f64 as the reference turns it
/// (`ops/rope.h`), the row reductions and RMSNorm that every stage's chain shares (`ops/rows.h`),
/// and the page table as every stage reads it (`ops/paging.h`, the device form of
/// `model::paging`).
pub const OPS: &[(&str, &str)] = &[
    ("ops/team.h", include_str!("../../../kernels/ops/team.h")),
    ("ops/copy.h", include_str!("../../../kernels/ops/copy.h")),
    (
        "ops/warp_mma.h",
        include_str!("../../../kernels/ops/warp_mma.h"),
    ),
    (
        "ops/warpgroup_mma.h",
        include_str!("../../../kernels/ops/warpgroup_mma.h"),
    ),
    (
        "ops/linear.h",
        include_str!("../../../kernels/ops/linear.h"),
    ),
    ("ops/rope.h", include_str!("../../../kernels/ops/rope.h")),
    ("ops/rows.h", include_str!("../../../kernels/ops/rows.h")),
    (
        "ops/paging.h",
        include_str!("../../../kernels/ops/paging.h"),
    ),
];

/// The host stand-in of the prelude (`kernels/host/prelude.h`) and the CPU-thread launcher
/// (`kernels/host/launch.h`): with them a kernel's own source runs on CPU threads (host emulation),
/// the prelude's name resolving to the stand-in.
pub const HOST_PRELUDE: (&str, &str) =
    ("prelude.h", include_str!("../../../kernels/host/prelude.h"));
pub const HOST_LAUNCH: (&str, &str) = ("launch.h", include_str!("../../../kernels/host/launch.h"));

/// One compilation unit: a main file, the headers it may include, and shape defines.
#[derive(Clone, Debug)]
pub struct KernelSource {
    name: String,
    text: String,
    headers: BTreeMap<String, String>,
    defines: BTreeMap<String, String>,
}

impl KernelSource {
    /// A source that may include the prelude (and its numerics) and the ops layer by name.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Self {
        let headers = [PRELUDE, NUMERICS]
            .into_iter()
            .chain(OPS.iter().copied())
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect();
        KernelSource {
            name: name.into(),
            text: text.into(),
            headers,
            defines: BTreeMap::new(),
        }
    }

    /// A new main file `name` that may include this source's main file by its name: the headers
    /// and defines are kept (a host-emulation driver around a kernel is made so).
    pub fn wrap(self, name: impl Into<String>, text: impl Into<String>) -> Self {
        let mut headers = self.headers;
        headers.insert(self.name, self.text);
        KernelSource {
            name: name.into(),
            text: text.into(),
            headers,
            defines: self.defines,
        }
    }

    /// The same unit with its main file's text replaced (a host build's stand-in for a line the
    /// host cannot take).
    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        self.text = text.into();
        self
    }

    /// The main file's text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Makes `#include "name"` resolve to `text`.
    pub fn header(mut self, name: impl Into<String>, text: impl Into<String>) -> Self {
        self.headers.insert(name.into(), text.into());
        self
    }

    /// Adds `-Dname=value`; shape constants arrive this way so loops have compile-time bounds.
    pub fn define(mut self, name: impl Into<String>, value: impl ToString) -> Self {
        self.defines.insert(name.into(), value.to_string());
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn defines(&self) -> &BTreeMap<String, String> {
        &self.defines
    }

    /// The main file with every quoted include replaced by its header, each header once
    /// (they all carry `#pragma once` semantics), with `#line` markers for readable errors.
    pub fn flatten(&self) -> Result<String> {
        let mut out = String::new();
        let mut seen = BTreeSet::new();
        self.flatten_into(&self.name, &self.text, &mut seen, &mut out, 0)?;
        Ok(out)
    }

    fn flatten_into(
        &self,
        file: &str,
        text: &str,
        seen: &mut BTreeSet<String>,
        out: &mut String,
        depth: usize,
    ) -> Result<()> {
        if depth > 16 {
            return Err(self.error(format!("includes nested deeper than 16 at {file}")));
        }
        out.push_str(&format!("#line 1 \"{file}\"\n"));
        for (number, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("#pragma once") {
                out.push('\n');
                continue;
            }
            let Some(included) = quoted_include(trimmed) else {
                out.push_str(line);
                out.push('\n');
                continue;
            };
            let Some(header) = self.headers.get(included) else {
                return Err(self.error(format!(
                    "{file}:{}: #include \"{included}\" names no registered header (known: {})",
                    number + 1,
                    self.headers.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            };
            if seen.insert(included.to_string()) {
                self.flatten_into(included, header, seen, out, depth + 1)?;
            }
            out.push_str(&format!("#line {} \"{file}\"\n", number + 2));
        }
        Ok(())
    }

    fn error(&self, message: String) -> DeviceError {
        DeviceError::Source {
            kernel: self.name.clone(),
            message,
        }
    }
}

fn quoted_include(line: &str) -> Option<&str> {
    let rest = line
        .strip_prefix('#')?
        .trim_start()
        .strip_prefix("include")?;
    let rest = rest.trim_start().strip_prefix('"')?;
    rest.split('"').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flatten_inlines_each_header_once() {
        let src = KernelSource::new("k.hip", "#include \"a.h\"\n#include \"a.h\"\nbody\n")
            .header("a.h", "#pragma once\nint a;\n");
        let flat = src.flatten().unwrap();
        assert_eq!(flat.matches("int a;").count(), 1);
        assert!(flat.contains("body"));
    }

    #[test]
    fn unknown_header_is_an_error_naming_it() {
        let src = KernelSource::new("k.hip", "#include \"missing.h\"\n");
        let err = src.flatten().unwrap_err().to_string();
        assert!(
            err.contains("missing.h") && err.contains("k.hip:1"),
            "{err}"
        );
    }

    #[test]
    fn prelude_is_always_available() {
        let flat = KernelSource::new("k.hip", "#include \"prelude.h\"\n")
            .flatten()
            .unwrap();
        assert!(flat.contains("mono_f32_to_e4m3"));
    }
}
