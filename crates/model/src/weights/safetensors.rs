//! Hugging Face safetensors checkpoints: memory-mapped (a real checkpoint is hundreds of GB; only
//! the tensors asked for are touched), bf16 / f16 / f32 read as they are, FP8 E4M3 with its
//! `weight_scale_inv` block scales multiplied in. Also the writer the tests and tools use.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Metadata, TensorInfo, TensorView};
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use super::fp8::{scale_shape, Fp8Weight};
use super::{checkpoint_tensors, Synthetic, WeightError, WeightSource};
use crate::format::{Storage, WeightFormat};
use crate::ModelConfig;

const SCALE_SUFFIX: &str = "_scale_inv";
/// What Hugging Face writes for a sharded checkpoint: `weight_map` names each tensor's file.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// What Hugging Face writes for a checkpoint in one file.
pub const SINGLE_FILE: &str = "model.safetensors";

/// The files of a checkpoint, mapped, with where each tensor is. Opening reads only the headers.
pub struct Checkpoint {
    /// What was opened: the index, or the one safetensors file. Errors name it.
    origin: PathBuf,
    files: Vec<MappedFile>,
    index: HashMap<String, (usize, TensorInfo)>,
}

struct MappedFile {
    path: PathBuf,
    map: Mmap,
    /// Where tensor data starts: after the 8-byte length and the JSON header.
    data_start: usize,
}

#[derive(Deserialize)]
struct IndexJson {
    weight_map: BTreeMap<String, String>,
}

impl Checkpoint {
    /// Opens a checkpoint folder as Hugging Face writes one: the files that
    /// [`INDEX_FILE`]'s `weight_map` names when it is there (sharded), else [`SINGLE_FILE`].
    /// Nothing else in the folder is read, so files beside the model (outputs, other formats)
    /// cannot add tensors to it. A path to a file opens that safetensors file alone.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, WeightError> {
        let path = path.as_ref();
        if !path.is_dir() {
            return Self::single(path);
        }
        let index = path.join(INDEX_FILE);
        if index.is_file() {
            return Self::sharded(path, &index);
        }
        let single = path.join(SINGLE_FILE);
        if single.is_file() {
            return Self::single(&single);
        }
        Err(WeightError::NoCheckpoint {
            dir: path.to_path_buf(),
            found: folder_listing(path)?,
        })
    }

    fn single(path: &Path) -> Result<Self, WeightError> {
        let (mapped, metadata) = map_file(path)?;
        let index = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, (0, info.clone())))
            .collect();
        Ok(Checkpoint {
            origin: path.to_path_buf(),
            files: vec![mapped],
            index,
        })
    }

    fn sharded(dir: &Path, index_path: &Path) -> Result<Self, WeightError> {
        let bad_index = |reason: String| WeightError::Index {
            path: index_path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(index_path).map_err(|source| WeightError::Io {
            path: index_path.to_path_buf(),
            source,
        })?;
        let parsed: IndexJson =
            serde_json::from_str(&text).map_err(|e| bad_index(e.to_string()))?;
        let mut by_file: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, file) in &parsed.weight_map {
            // Shards sit beside the index; a path elsewhere is not a Hugging Face layout.
            if Path::new(file).file_name() != Some(std::ffi::OsStr::new(file)) {
                return Err(bad_index(format!(
                    "`{name}` is in `{file}`, not a file name in the index's folder"
                )));
            }
            by_file.entry(file).or_default().push(name);
        }
        let mut files = Vec::with_capacity(by_file.len());
        let mut index = HashMap::with_capacity(parsed.weight_map.len());
        for (file, names) in by_file {
            let file_path = dir.join(file);
            if !file_path.is_file() {
                return Err(WeightError::ShardMissing {
                    index: index_path.to_path_buf(),
                    name: names[0].to_owned(),
                    file: file_path,
                });
            }
            let (mapped, metadata) = map_file(&file_path)?;
            let held = metadata.tensors();
            for name in names {
                let info = held.get(name).ok_or_else(|| WeightError::NotInShard {
                    index: index_path.to_path_buf(),
                    name: name.to_owned(),
                    file: file_path.clone(),
                })?;
                index.insert(name.to_owned(), (files.len(), (*info).clone()));
            }
            files.push(mapped);
        }
        Ok(Checkpoint {
            origin: index_path.to_path_buf(),
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

    /// Whether any tensor is stored as FP8 E4M3 (a published FP8 checkpoint).
    pub fn stores_fp8(&self) -> bool {
        self.index
            .values()
            .any(|(_, info)| info.dtype == Dtype::F8_E4M3)
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
            source_desc: self.origin.display().to_string(),
        })?;
        let file = &self.files[*file_index];
        let (begin, end) = info.data_offsets;
        // read_metadata has checked that the offsets lie inside the file.
        let bytes = &file.map[file.data_start + begin..file.data_start + end];
        Ok((file, info, bytes))
    }

    /// [`Checkpoint::raw`] after a check that the tensor has `shape`.
    fn shaped(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<(&MappedFile, &TensorInfo, &[u8]), WeightError> {
        let (file, info, bytes) = self.raw(name)?;
        if info.shape != shape {
            return Err(WeightError::Shape {
                name: name.to_owned(),
                expected: shape.to_vec(),
                found: info.shape.clone(),
                location: format!(" in {}", file.path.display()),
            });
        }
        Ok((file, info, bytes))
    }

    fn scale_for(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>, WeightError> {
        let scale_name = format!("{name}{SCALE_SUFFIX}");
        let (file, info, bytes) = match self.shaped(&scale_name, &scale_shape(rows, cols)) {
            Err(WeightError::Missing { .. }) => {
                return Err(WeightError::Dtype {
                    name: name.to_owned(),
                    path: self.origin.clone(),
                    reason: format!("stored as F8_E4M3 but `{scale_name}` is missing"),
                })
            }
            found => found?,
        };
        decode(&scale_name, file, info.dtype, bytes)
    }
}

impl WeightSource for Checkpoint {
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightError> {
        if let &[rows, cols] = shape {
            if let Some(weight) = self.fp8(name, rows, cols)? {
                return Ok(weight.dequantise());
            }
        }
        let (file, info, bytes) = self.shaped(name, shape)?;
        let has_scale = self.index.contains_key(&format!("{name}{SCALE_SUFFIX}"));
        match info.dtype {
            Dtype::F8_E4M3 => Err(WeightError::Dtype {
                name: name.to_owned(),
                path: file.path.clone(),
                reason: "F8_E4M3 is supported for 2-D block-scaled weights only".to_owned(),
            }),
            dtype if has_scale => Err(WeightError::Dtype {
                name: name.to_owned(),
                path: file.path.clone(),
                reason: format!("has a `{SCALE_SUFFIX}` scale but is stored as {dtype:?}, not FP8"),
            }),
            dtype => decode(name, file, dtype, bytes),
        }
    }

    fn fp8(&self, name: &str, rows: usize, cols: usize) -> Result<Option<Fp8Weight>, WeightError> {
        let (_, info, bytes) = self.shaped(name, &[rows, cols])?;
        if info.dtype != Dtype::F8_E4M3 {
            return Ok(None);
        }
        Ok(Some(Fp8Weight {
            rows,
            cols,
            codes: bytes.to_vec(),
            scales: self.scale_for(name, rows, cols)?,
        }))
    }
}

/// The names in `dir`, sorted, for an error that says what was there instead of a checkpoint.
fn folder_listing(dir: &Path) -> Result<Vec<String>, WeightError> {
    let io = |source| WeightError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut names = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)?;
    names.sort();
    Ok(names)
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

/// Writes the synthetic weights of `cfg` as one [`SINGLE_FILE`] in `dir` with the published
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
    let path = dir.join(SINGLE_FILE);
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
