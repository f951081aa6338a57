//! Per-kernel resource reports parsed from the compilers' own output (ptxas -v, clang's
//! kernel-resource-usage remarks), so CI can show registers, spills and shared memory per kernel.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelResources {
    pub kernel: String,
    /// Registers per thread (NVIDIA) or VGPRs per lane (AMD).
    pub registers: u32,
    /// Scalar registers per wave (AMD only).
    pub sgprs: Option<u32>,
    /// NVIDIA: bytes of spill stores + loads. AMD: spilled VGPRs + SGPRs.
    pub spills: u32,
    /// NVIDIA: stack frame bytes. AMD: scratch bytes per lane.
    pub scratch_bytes: u32,
    /// Static shared memory / LDS bytes per block.
    pub shared_bytes: u32,
}

fn number_before(text: &str, unit: &str) -> Option<u32> {
    let end = text.find(unit)?;
    text[..end].split_whitespace().last()?.parse().ok()
}

fn number_after(text: &str, label: &str) -> Option<u32> {
    let start = text.find(label)? + label.len();
    text[start..].split_whitespace().next()?.parse().ok()
}

/// Reads NVRTC's `--ptxas-options=-v` log.
pub fn parse_ptxas_log(log: &str) -> Vec<KernelResources> {
    let mut kernels: Vec<KernelResources> = Vec::new();
    let mut in_current_entry = false;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("").to_string();
            kernels.push(KernelResources {
                kernel: name,
                ..Default::default()
            });
            in_current_entry = true;
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            in_current_entry = kernels.last().is_some_and(|k| k.kernel == rest.trim());
        } else if let (true, Some(k)) = (in_current_entry, kernels.last_mut()) {
            if line.contains("stack frame") {
                k.scratch_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                k.spills = number_before(line, "bytes spill stores").unwrap_or(0)
                    + number_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used ") && line.contains("registers") {
                k.registers = number_before(line, "registers").unwrap_or(0);
                k.shared_bytes = number_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    kernels
}

/// Reads clang's `-Rpass-analysis=kernel-resource-usage` remarks.
pub fn parse_clang_remarks(log: &str) -> Vec<KernelResources> {
    let mut kernels: Vec<KernelResources> = Vec::new();
    for line in log.lines().filter(|l| l.contains("remark:")) {
        let remark = line.split("remark:").nth(1).unwrap_or("");
        let remark = remark.split(" [-Rpass").next().unwrap_or("").trim();
        if let Some(name) = remark.strip_prefix("Function Name:") {
            kernels.push(KernelResources {
                kernel: name.trim().to_string(),
                sgprs: Some(0),
                ..Default::default()
            });
            continue;
        }
        let Some(k) = kernels.last_mut() else {
            continue;
        };
        let value = |label: &str| number_after(remark, label);
        if let Some(v) =
            value("TotalSGPRs:").or_else(|| value("SGPRs:").filter(|_| !remark.contains("Spill")))
        {
            k.sgprs = Some(v);
        } else if let Some(v) = value("VGPRs:").filter(|_| !remark.contains("Spill")) {
            k.registers = v;
        } else if let Some(v) = value("ScratchSize [bytes/lane]:") {
            k.scratch_bytes = v;
        } else if let Some(v) = value("SGPRs Spill:").or_else(|| value("VGPRs Spill:")) {
            k.spills += v;
        } else if let Some(v) = value("LDS Size [bytes/block]:") {
            k.shared_bytes = v;
        }
    }
    kernels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_log() {
        let log = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'copy_words' for 'sm_90a'\n\
            ptxas info    : Function properties for copy_words\n\
            \x20   8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
            ptxas info    : Used 18 registers, used 1 barriers, 4096 bytes smem, 380 bytes cmem[0]\n";
        let k = &parse_ptxas_log(log)[0];
        assert_eq!(
            (
                k.kernel.as_str(),
                k.registers,
                k.spills,
                k.scratch_bytes,
                k.shared_bytes
            ),
            ("copy_words", 18, 8, 8, 4096)
        );
    }

    #[test]
    fn clang_remarks() {
        let log = "t.hip:2:1: remark: Function Name: k [-Rpass-analysis=kernel-resource-usage]\n\
            t.hip:2:1: remark:     TotalSGPRs: 34 [-Rpass-analysis=kernel-resource-usage]\n\
            t.hip:2:1: remark:     VGPRs: 10 [-Rpass-analysis=kernel-resource-usage]\n\
            t.hip:2:1: remark:     ScratchSize [bytes/lane]: 16 [-Rpass-analysis=kernel-resource-usage]\n\
            t.hip:2:1: remark:     SGPRs Spill: 1 [-Rpass-analysis=kernel-resource-usage]\n\
            t.hip:2:1: remark:     VGPRs Spill: 2 [-Rpass-analysis=kernel-resource-usage]\n\
            t.hip:2:1: remark:     LDS Size [bytes/block]: 512 [-Rpass-analysis=kernel-resource-usage]\n";
        let k = &parse_clang_remarks(log)[0];
        assert_eq!(
            (
                k.kernel.as_str(),
                k.registers,
                k.sgprs,
                k.spills,
                k.scratch_bytes,
                k.shared_bytes
            ),
            ("k", 10, Some(34), 3, 16, 512)
        );
    }
}
