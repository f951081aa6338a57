//! Each layer's caches on the device, outside the step's activation arena: the MLA cache (one
//! record a cache slot, `mla::CacheLayout`) and, on a full-indexer layer, the paged index-key
//! cache (`indexer::layout::CacheLayout`), both addressed through the step's one page table
//! (`model::paging`). Their bytes are made on the host ([`CacheImages`]), either from the CPU
//! reference's own prefill (for checks against the reference step) or as hashed records (for
//! timing at any preset), then uploaded once ([`StepCaches`]).

use device::{Buffer, Device};
use indexer::layout::CacheLayout as IndexLayout;
use mla::CacheLayout as MlaLayout;
use model::paging::{PageTable, PAGE_TOKENS};
use model::{CacheFormat, IndexerKind, ModelConfig};

use crate::reference::DecodeState;
use crate::step::{Result, StepError};

/// One layer's cache bytes on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerImage {
    pub layer: usize,
    /// `[pages * PAGE_TOKENS][record]`.
    pub mla: Vec<u8>,
    /// `[pages][page_bytes]`, on full-indexer layers.
    pub index_keys: Option<Vec<u8>>,
}

/// Every layer's cache bytes over `pages` physical pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheImages {
    pub pages: u32,
    pub mla: MlaLayout,
    pub index: IndexLayout,
    pub layers: Vec<LayerImage>,
}

fn invalid(reason: String) -> StepError {
    StepError::Invalid(reason)
}

/// The physical pages a table names: one past its largest page.
fn table_pages(table: &PageTable) -> u32 {
    table.flat().iter().max().map_or(0, |&p| p + 1)
}

impl CacheImages {
    /// Zeroed caches of every layer of `cfg` over the pages `table` names.
    pub fn empty(cfg: &ModelConfig, format: CacheFormat, table: &PageTable) -> Result<Self> {
        let mla = MlaLayout::new(cfg, format).map_err(|e| invalid(e.to_string()))?;
        let index =
            IndexLayout::new(cfg.index_head_dim as u32).map_err(|e| invalid(e.to_string()))?;
        let pages = table_pages(table);
        let slots = pages as usize * PAGE_TOKENS as usize;
        let layers = cfg
            .layer_plan()?
            .into_iter()
            .map(|plan| LayerImage {
                layer: plan.index,
                mla: vec![0; slots * mla.bytes_per_token()],
                index_keys: (plan.indexer == IndexerKind::Full)
                    .then(|| vec![0; pages as usize * index.page_bytes() as usize]),
            })
            .collect();
        Ok(CacheImages {
            pages,
            mla,
            index,
            layers,
        })
    }

    /// The caches the reference's `state` holds (request i's tokens at request i's pages of
    /// `table`), byte for byte: the MLA records as the reference encodes them (its cache format
    /// must be `format`), the index keys' E4M3 codes and scales. Fails on a state whose caches
    /// are not in a device format or hold more tokens than the table's pages.
    pub fn from_reference(
        cfg: &ModelConfig,
        format: CacheFormat,
        state: &DecodeState,
        table: &PageTable,
    ) -> Result<Self> {
        let mut images = Self::empty(cfg, format, table)?;
        let record = images.mla.bytes_per_token();
        let index = images.index;
        let d = index.head_dim() as usize;
        for request in 0..state.requests() {
            for image in &mut images.layers {
                let l = image.layer;
                let bytes = state.mla_bytes(request, l).ok_or_else(|| {
                    invalid(format!(
                        "request {request}, layer {l}: the reference's MLA cache is not in a \
                         device format (use CacheStore::Format)"
                    ))
                })?;
                if bytes.len() % record != 0 {
                    return Err(invalid(format!(
                        "request {request}, layer {l}: {} bytes of MLA cache are not whole {record}-byte \
                         records of the {format:?} format",
                        bytes.len()
                    )));
                }
                for (t, rec) in bytes.chunks_exact(record).enumerate() {
                    let slot = slot_of(table, request, t)?;
                    let at = slot as usize * record;
                    image.mla[at..at + record].copy_from_slice(rec);
                }
                let (Some(keys), Some(cache)) =
                    (state.index_keys(request, l), image.index_keys.as_mut())
                else {
                    continue;
                };
                for (t, key) in keys.iter().enumerate() {
                    if key.values.len() != d {
                        return Err(invalid(format!(
                            "request {request}, layer {l}: an index key of {} values; the cache \
                             holds {d}",
                            key.values.len()
                        )));
                    }
                    let (page, place) = table
                        .locate(request, t as u32)
                        .ok_or_else(|| past_table(request, t))?;
                    let at = index.key_offset(page, place) as usize;
                    cache[at..at + d].copy_from_slice(&key.codes());
                    let s = index.scale_offset(page, place) as usize;
                    cache[s..s + 4].copy_from_slice(&key.scale.to_le_bytes());
                }
            }
        }
        Ok(images)
    }

    /// Hashed caches: `contexts[i]` tokens of request i, every layer's records a function of
    /// `seed` and the layer (E4M3 codes without NaNs, positive power-of-two scales, bf16 values
    /// within about +-1), so two runs agree and no value overflows. Layers are filled on the
    /// host's cores.
    pub fn synthetic(
        cfg: &ModelConfig,
        format: CacheFormat,
        table: &PageTable,
        contexts: &[u32],
        seed: u64,
    ) -> Result<Self> {
        let mut images = Self::empty(cfg, format, table)?;
        let (mla, index) = (images.mla, images.index);
        let record = mla.bytes_per_token();
        let mut slots = Vec::new();
        for (request, &context) in contexts.iter().enumerate() {
            for t in 0..context as usize {
                let (page, place) = table
                    .locate(request, t as u32)
                    .ok_or_else(|| past_table(request, t))?;
                slots.push((page, place));
            }
        }
        let fill = |image: &mut LayerImage| {
            let mut bits = Hash(seed ^ (image.layer as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            for &(page, place) in &slots {
                let slot = (page * PAGE_TOKENS + place) as usize;
                let rec = &mut image.mla[slot * record..(slot + 1) * record];
                fill_record(&mla, rec, &mut bits);
                let Some(cache) = image.index_keys.as_mut() else {
                    continue;
                };
                let at = index.key_offset(page, place) as usize;
                for c in &mut cache[at..at + index.head_dim() as usize] {
                    *c = bits.e4m3();
                }
                let scale = 2f32.powi(-2 - (cache[at] % 5) as i32);
                let s = index.scale_offset(page, place) as usize;
                cache[s..s + 4].copy_from_slice(&scale.to_le_bytes());
            }
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let chunk = images.layers.len().div_ceil(threads).max(1);
        std::thread::scope(|s| {
            for part in images.layers.chunks_mut(chunk) {
                s.spawn(|| part.iter_mut().for_each(fill));
            }
        });
        Ok(images)
    }

    /// The images on `dev`.
    pub fn upload(&self, dev: &Device) -> Result<StepCaches> {
        let layers = self
            .layers
            .iter()
            .map(|image| {
                Ok(LayerCache {
                    layer: image.layer,
                    mla: dev.upload(&image.mla)?,
                    index_keys: image
                        .index_keys
                        .as_ref()
                        .map(|k| dev.upload(k))
                        .transpose()?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(StepCaches {
            pages: self.pages,
            mla: self.mla,
            index: self.index,
            layers,
        })
    }
}

fn past_table(request: usize, t: usize) -> StepError {
    invalid(format!(
        "request {request}: cached token {t} is past its pages in the step's page table"
    ))
}

fn slot_of(table: &PageTable, request: usize, t: usize) -> Result<u32> {
    table
        .slot(request, t as u32)
        .map(|s| s as u32)
        .ok_or_else(|| past_table(request, t))
}

/// A stream of hashed bits (splitmix64).
struct Hash(u64);

impl Hash {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// An E4M3 code of magnitude below 2 (exponent field at most 7), so no NaN and no large
    /// value.
    fn e4m3(&mut self) -> u8 {
        (self.next() as u8) & 0xbf
    }

    /// bf16 bits of a value within +-1.
    fn bf16(&mut self) -> [u8; 2] {
        let v = (self.next() >> 40) as f32 / (1u64 << 23) as f32 * 2.0 - 1.0;
        ((v.to_bits() >> 16) as u16).to_le_bytes()
    }
}

/// One hashed MLA record in `layout`.
fn fill_record(layout: &MlaLayout, rec: &mut [u8], bits: &mut Hash) {
    match layout.format {
        CacheFormat::Fp8 => {
            for c in &mut rec[layout.latent_bytes()] {
                *c = bits.e4m3();
            }
            for s in rec[layout.scale_bytes()].chunks_exact_mut(4) {
                let scale = 2f32.powi(-6 - (bits.next() % 3) as i32);
                s.copy_from_slice(&scale.to_le_bytes());
            }
        }
        CacheFormat::Bf16 => {
            for c in rec[layout.latent_bytes()].chunks_exact_mut(2) {
                c.copy_from_slice(&bits.bf16());
            }
        }
    }
    for c in rec[layout.rope_bytes()].chunks_exact_mut(2) {
        c.copy_from_slice(&bits.bf16());
    }
}

/// One layer's caches on the device.
pub struct LayerCache {
    pub layer: usize,
    pub mla: Buffer<u8>,
    /// On full-indexer layers.
    pub index_keys: Option<Buffer<u8>>,
}

/// Every layer's caches on the device; they persist across steps (each step's launches write
/// its new tokens' records).
pub struct StepCaches {
    pub pages: u32,
    pub mla: MlaLayout,
    pub index: IndexLayout,
    pub layers: Vec<LayerCache>,
}

impl StepCaches {
    /// Layer `layer`'s caches, or an error naming it.
    pub fn layer(&self, layer: usize) -> Result<&LayerCache> {
        self.layers
            .iter()
            .find(|c| c.layer == layer)
            .ok_or_else(|| invalid(format!("no caches for layer {layer}")))
    }
}
