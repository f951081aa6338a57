//! Hugging Face safetensors checkpoints: memory-mapped (a real checkpoint is hundreds of GB; only
//! the tensors asked for are touched), bf16 / f16 / f32 read as they are, FP8 E4M3 with its
//! `weight_scale_inv` block scales multiplied in. Also the writer the tests and tools use.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Metadata, TensorInfo, TensorView};
use safetensors::{Dtype, SafeTensors};

use super::fp8::{scale_shape, Fp8Weight};
use super::{checkpoint_tensors, Synthetic, WeightError, WeightSource};
use crate::format::{Storage, WeightFormat};
use crate::ModelConfig;

const SCALE_SUFFIX: &str = "_scale_inv";

/// Every `*.safetensors` file of a checkpoint folder, mapped, with an index of where each tensor
/// is. Opening reads only the headers.
pub struct Checkpoint {
    dir: PathBuf,
    files: Vec<MappedFile>,
    index: HashMap<String, (usize, TensorInfo)>,
}

struct MappedFile {
    path: PathBuf,
    map: Mmap,
    /// Where tensor data starts: after the 8-byte length and the JSON header.
    data_start: usize,
}

impl Checkpoint {
    /// Opens a folder of `*.safetensors` files (sharded or not), or a single file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, WeightError> {
        let path = path.as_ref();
        let io = |source| WeightError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut paths: Vec<PathBuf> = if path.is_dir() {
            std::fs::read_dir(path)
                .map_err(io)?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
                .collect()
        } else {
            vec![path.to_path_buf()]
        };
        paths.sort();
        if paths.is_empty() {
            return Err(WeightError::NoFiles(path.to_path_buf()));
        }
        let mut files: Vec<MappedFile> = Vec::with_capacity(paths.len());
        let mut index: HashMap<String, (usize, TensorInfo)> = HashMap::new();
        for (file_index, file_path) in paths.into_iter().enumerate() {
            let (mapped, metadata) = map_file(&file_path)?;
            for (name, info) in metadata.tensors() {
                if let Some((first, _)) = index.get(&name) {
                    return Err(WeightError::Duplicate {
                        name,
                        // Names are unique within one header, so the first is in an earlier file.
                        first: files[*first].path.clone(),
                        second: file_path.clone(),
                    });
                }
                index.insert(name, (file_index, info.clone()));
            }
            files.push(mapped);
        }
        Ok(Checkpoint {
            dir: path.to_path_buf(),
            files,
            index,
        })
    }

    /// Names of every tensor, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.index.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The tensor's dtype and shape as stored, if present.
    pub fn info(&self, name: &str) -> Option<(Dtype, &[usize])> {
        self.index
            .get(name)
            .map(|(_, info)| (info.dtype, info.shape.as_slice()))
    }

    fn raw(&self, name: &str) -> Result<(&MappedFile, &TensorInfo, &[u8]), WeightError> {
        let (file_index, info) = self.index.get(name).ok_or_else(|| WeightError::Missing {
            name: name.to_owned(),
            source_desc: self.dir.display().to_string(),
        })?;
        let file = &self.files[*file_index];
        let (begin, end) = info.data_offsets;
        // read_metadata has checked that the offsets lie inside the file.
        let bytes = &file.map[file.data_start + begin..file.data_start + end];
        Ok((file, info, bytes))
    }

    fn scale_for(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>, WeightError> {
        let scale_name = format!("{name}{SCALE_SUFFIX}");
        let (file, info, bytes) = self.raw(&scale_name).map_err(|_| WeightError::Dtype {
            name: name.to_owned(),
            path: self.dir.clone(),
            reason: format!("stored as F8_E4M3 but `{scale_name}` is missing"),
        })?;
        let expected = scale_shape(rows, cols);
        if info.shape != expected {
            return Err(WeightError::Shape {
                name: scale_name,
                expected: expected.to_vec(),
                found: info.shape.clone(),
                location: format!(" in {}", file.path.display()),
            });
        }
        decode(&scale_name, file, info.dtype, bytes)
    }
}

impl WeightSource for Checkpoint {
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightError> {
        let (file, info, bytes) = self.raw(name)?;
        if info.shape != shape {
            return Err(WeightError::Shape {
                name: name.to_owned(),
                expected: shape.to_vec(),
                found: info.shape.clone(),
                location: format!(" in {}", file.path.display()),
            });
        }
        let has_scale = self.index.contains_key(&format!("{name}{SCALE_SUFFIX}"));
        match (info.dtype, shape) {
            (Dtype::F8_E4M3, &[rows, cols]) => {
                let scales = self.scale_for(name, rows, cols)?;
                let weight = Fp8Weight {
                    rows,
                    cols,
                    codes: bytes.to_vec(),
                    scales,
                };
                Ok(weight.dequantise())
            }
            (Dtype::F8_E4M3, _) => Err(WeightError::Dtype {
                name: name.to_owned(),
                path: file.path.clone(),
                reason: "F8_E4M3 is supported for 2-D block-scaled weights only".to_owned(),
            }),
            (dtype, _) if has_scale => Err(WeightError::Dtype {
                name: name.to_owned(),
                path: file.path.clone(),
                reason: format!("has a `{SCALE_SUFFIX}` scale but is stored as {dtype:?}, not FP8"),
            }),
            (dtype, _) => decode(name, file, dtype, bytes),
        }
    }
}

fn map_file(path: &Path) -> Result<(MappedFile, Metadata), WeightError> {
    let file = File::open(path).map_err(|source| WeightError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // SAFETY: the map is read-only and the checkpoint is not expected to change while it is open;
    // a file truncated underneath would be a bus error, the usual caveat of every mmap loader.
    let map = unsafe { Mmap::map(&file) }.map_err(|source| WeightError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let (header_len, metadata) =
        SafeTensors::read_metadata(&map).map_err(|e| WeightError::Format {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    Ok((
        MappedFile {
            path: path.to_path_buf(),
            map,
            data_start: 8 + header_len,
        },
        metadata,
    ))
}

fn decode(
    name: &str,
    file: &MappedFile,
    dtype: Dtype,
    bytes: &[u8],
) -> Result<Vec<f32>, WeightError> {
    let values = match dtype {
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        other => {
            return Err(WeightError::Dtype {
                name: name.to_owned(),
                path: file.path.clone(),
                reason: format!("dtype {other:?} is not one of BF16, F16, F32, F8_E4M3"),
            })
        }
    };
    Ok(values)
}

/// Writes the synthetic weights of `cfg` as one `model.safetensors` in `dir` with the published
/// names: bf16, the router bias fp32, and in the FP8 format the quantisable matrices as F8_E4M3
/// plus `weight_scale_inv`. Returns the file's path.
pub fn write_checkpoint(
    cfg: &ModelConfig,
    weights: &Synthetic,
    dir: &Path,
) -> Result<PathBuf, WeightError> {
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for spec in checkpoint_tensors(cfg)? {
        match (weights.format(), spec.storage, &spec.shape[..]) {
            (WeightFormat::Fp8, Storage::Quantisable, &[rows, cols]) => {
                let fp8 = weights.fp8(&spec)?;
                let scale_name = format!("{}{SCALE_SUFFIX}", spec.name);
                owned.push((spec.name, Dtype::F8_E4M3, spec.shape, fp8.codes));
                let scales = fp8.scales.iter().flat_map(|s| s.to_le_bytes()).collect();
                owned.push((
                    scale_name,
                    Dtype::F32,
                    scale_shape(rows, cols).to_vec(),
                    scales,
                ));
            }
            (_, Storage::F32, _) => {
                let values = weights.tensor(&spec.name, &spec.shape)?;
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                owned.push((spec.name, Dtype::F32, spec.shape, bytes));
            }
            _ => {
                let values = weights.tensor(&spec.name, &spec.shape)?;
                let bytes = values
                    .iter()
                    .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                    .collect();
                owned.push((spec.name, Dtype::BF16, spec.shape, bytes));
            }
        }
    }
    let path = dir.join("model.safetensors");
    let format_error = |e: safetensors::SafeTensorError| WeightError::Format {
        path: path.clone(),
        reason: e.to_string(),
    };
    let views = owned
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes).map(|v| (name.as_str(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(format_error)?;
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::serialize_to_file(views, Some(metadata), &path).map_err(format_error)?;
    Ok(path)
}
