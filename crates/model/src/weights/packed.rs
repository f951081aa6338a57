//! The device layout of a linear layer's weight: the order in which the weight-streaming tile
//! (`kernels/ops/linear.h`) reads it, made once at load from the published `[out, in]` layout.
//! Every stage that multiplies by a weight (MLA's projections, the experts, the head) streams
//! this layout, so its math lives here alone.
//!
//! The tile computes 16 output rows ("packed rows") at a time: a **tile**. A tile is two
//! **halves** of 8 packed rows; a half is 8 consecutive rows of one source matrix, so one
//! published 128 x 128 scale covers a half within a k-block. With [`Pairing::Plain`] tile `t`
//! holds rows `16 t ..16 t + 16` of the one source; with [`Pairing::GateUp`] half 0 holds rows
//! `8 t ..8 t + 8` of the gate and half 1 the same rows of the up projection, so SwiGLU can be
//! applied as soon as the tile's sums are known. Rows past the source's end are zeros.
//!
//! Along `in` (k) a tile is cut into k-blocks of 128 (the scale block). A k-block of a tile is
//! [`PackedLayout::block_bytes`] contiguous bytes: `loads` warp-wide loads of 32 lanes x 16
//! bytes, load `j` covering k `128 kb + j * k_per_load ..` (32 k for FP8, 16 for bf16). Lane
//! `l = 4 g + t` holds, in each 16-byte load, what the `m16n8k16` matrix instruction wants as its
//! A operand (rows g and g + 8, k pairs 2t and 2t + 8): element `i` (a byte of FP8 or a bf16)
//! is, with `s = i / 8`, `reg = (i % 8) / 2`, `e = i % 2`,
//! row `g + 8 (reg & 1)` of the tile and k `16 s + 2 t + 8 (reg >> 1) + e` of the load.
//! Blocks are stored tile-major (`(tile * k_blocks + kb) * block_bytes`), so a task that owns a
//! range of tiles reads one contiguous range.
//!
//! FP8 scales are packed `[tile][kb][half]` (fp32): the published scale of the block that holds
//! the half's rows (0 for a half made only of padding).

use super::fp8::{scale_shape, Fp8Weight};
use super::WeightError;
use crate::format::{WeightFormat, WEIGHT_BLOCK};

/// Packed rows a tile computes.
pub const TILE_ROWS: usize = 16;
/// Packed rows of a half tile (one source, one scale).
pub const HALF_ROWS: usize = 8;
/// Lanes of the warp-wide loads of the layout.
pub const LANES: usize = 32;
/// Bytes one lane loads at once.
pub const LOAD_BYTES: usize = 16;

/// How packed rows come from source matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pairing {
    /// One source; tile t is its rows 16 t .. 16 t + 16.
    Plain,
    /// Two sources of one shape (gate, up); tile t is gate rows 8 t .. 8 t + 8 then the same
    /// rows of up. The output of a tile is 8 columns of silu(gate) * up.
    GateUp,
}

impl Pairing {
    /// Source matrices this pairing reads.
    pub fn sources(self) -> usize {
        match self {
            Pairing::Plain => 1,
            Pairing::GateUp => 2,
        }
    }

    /// Output columns a tile produces.
    pub fn columns_per_tile(self) -> usize {
        match self {
            Pairing::Plain => TILE_ROWS,
            Pairing::GateUp => HALF_ROWS,
        }
    }
}

/// Where one packed element comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourceElement {
    /// Index of the source matrix (0 for plain, 0 gate / 1 up).
    pub source: usize,
    pub row: usize,
    pub k: usize,
    /// false for padding rows past the source's end (stored as zero).
    pub real: bool,
}

/// The packed layout of one `[n, k]` weight (or gate/up pair of that shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PackedLayout {
    pub format: WeightFormat,
    pub pairing: Pairing,
    /// Rows of each source (the published `out`).
    pub n: usize,
    /// Columns of each source (the published `in`).
    pub k: usize,
}

impl PackedLayout {
    /// Fails unless `k` is a positive multiple of the 128 k-block and `n` is positive.
    pub fn new(
        format: WeightFormat,
        pairing: Pairing,
        n: usize,
        k: usize,
    ) -> Result<Self, WeightError> {
        if n == 0 || k == 0 || k % WEIGHT_BLOCK != 0 {
            return Err(WeightError::Packing {
                reason: format!(
                    "a [{n}, {k}] weight: out must be positive and in a positive multiple of {WEIGHT_BLOCK}"
                ),
            });
        }
        Ok(PackedLayout {
            format,
            pairing,
            n,
            k,
        })
    }

    pub fn tiles(&self) -> usize {
        self.n.div_ceil(self.pairing.columns_per_tile())
    }

    pub fn k_blocks(&self) -> usize {
        self.k / WEIGHT_BLOCK
    }

    /// Bytes of one stored element.
    pub fn element_bytes(&self) -> usize {
        match self.format {
            WeightFormat::Fp8 => 1,
            WeightFormat::Bf16 => 2,
        }
    }

    /// Elements in one lane's 16-byte load.
    pub fn elements_per_load(&self) -> usize {
        LOAD_BYTES / self.element_bytes()
    }

    /// k covered by one warp-wide load (two `m16n8k16` steps for FP8, one for bf16).
    pub fn k_per_load(&self) -> usize {
        self.elements_per_load() * LANES / TILE_ROWS
    }

    /// Warp-wide loads per k-block of a tile.
    pub fn loads_per_block(&self) -> usize {
        WEIGHT_BLOCK / self.k_per_load()
    }

    pub fn block_bytes(&self) -> usize {
        self.loads_per_block() * LANES * LOAD_BYTES
    }

    /// Bytes of the packed weight (padding rows included).
    pub fn bytes(&self) -> usize {
        self.tiles() * self.k_blocks() * self.block_bytes()
    }

    /// fp32 scales of the packed weight: two per (tile, k-block) for FP8, none for bf16.
    pub fn scales_len(&self) -> usize {
        match self.format {
            WeightFormat::Fp8 => self.tiles() * self.k_blocks() * 2,
            WeightFormat::Bf16 => 0,
        }
    }

    pub fn scale_index(&self, tile: usize, kb: usize, half: usize) -> usize {
        (tile * self.k_blocks() + kb) * 2 + half
    }

    /// Source and row of packed row `row` (0..16) of `tile`.
    pub fn source_row(&self, tile: usize, row: usize) -> (usize, usize) {
        let (half, within) = (row / HALF_ROWS, row % HALF_ROWS);
        match self.pairing {
            Pairing::Plain => (0, tile * TILE_ROWS + row),
            Pairing::GateUp => (half, tile * HALF_ROWS + within),
        }
    }

    /// Where element `i` of lane `lane`'s load `j` of k-block `kb` of `tile` comes from.
    pub fn element(
        &self,
        tile: usize,
        kb: usize,
        j: usize,
        lane: usize,
        i: usize,
    ) -> SourceElement {
        let (g, t) = (lane / 4, lane % 4);
        let (s, reg, e) = (i / 8, (i % 8) / 2, i % 2);
        let row_in_tile = g + HALF_ROWS * (reg & 1);
        let k = kb * WEIGHT_BLOCK + j * self.k_per_load() + 16 * s + 2 * t + 8 * (reg >> 1) + e;
        let (source, row) = self.source_row(tile, row_in_tile);
        SourceElement {
            source,
            row,
            k,
            real: row < self.n,
        }
    }

    /// The element index (in units of stored elements) of element `i` of that load.
    pub fn element_index(&self, tile: usize, kb: usize, j: usize, lane: usize, i: usize) -> usize {
        let per_load = self.elements_per_load();
        let block = (tile * self.k_blocks() + kb) * self.loads_per_block() * LANES * per_load;
        block + (j * LANES + lane) * per_load + i
    }

    /// The inverse of [`element`](Self::element): the stored element index of `(source, row, k)`.
    pub fn position(&self, source: usize, row: usize, k: usize) -> usize {
        let (tile, row_in_tile) = match self.pairing {
            Pairing::Plain => (row / TILE_ROWS, row % TILE_ROWS),
            Pairing::GateUp => (row / HALF_ROWS, source * HALF_ROWS + row % HALF_ROWS),
        };
        let (g, half) = (row_in_tile % HALF_ROWS, row_in_tile / HALF_ROWS);
        let (kb, in_block) = (k / WEIGHT_BLOCK, k % WEIGHT_BLOCK);
        let (j, in_load) = (in_block / self.k_per_load(), in_block % self.k_per_load());
        let (s, in_step) = (in_load / 16, in_load % 16);
        let (hi, pair) = (in_step / 8, in_step % 8);
        let (t, e) = (pair / 2, pair % 2);
        let reg = half + 2 * hi;
        self.element_index(tile, kb, j, 4 * g + t, s * 8 + reg * 2 + e)
    }
}

/// A published weight, one of a packed matrix's sources.
#[derive(Debug, Clone, Copy)]
pub enum SourceWeight<'a> {
    /// E4M3 codes `[rows, cols]` with their 128 x 128 block scales.
    Fp8(&'a Fp8Weight),
    /// bf16 bit patterns `[rows, cols]`.
    Bf16 {
        rows: usize,
        cols: usize,
        bits: &'a [u16],
    },
}

impl SourceWeight<'_> {
    fn shape(&self) -> (usize, usize) {
        match self {
            SourceWeight::Fp8(w) => (w.rows, w.cols),
            SourceWeight::Bf16 { rows, cols, .. } => (*rows, *cols),
        }
    }

    fn format(&self) -> WeightFormat {
        match self {
            SourceWeight::Fp8(_) => WeightFormat::Fp8,
            SourceWeight::Bf16 { .. } => WeightFormat::Bf16,
        }
    }
}

/// A weight in the device layout: the stored elements as bytes (bf16 little-endian) and the
/// packed FP8 scales.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedWeight {
    pub layout: PackedLayout,
    pub bytes: Vec<u8>,
    pub scales: Vec<f32>,
}

/// Repacks `sources` (one for [`Pairing::Plain`], gate then up for [`Pairing::GateUp`]; all of
/// one format and shape) into the device layout.
pub fn pack(pairing: Pairing, sources: &[SourceWeight]) -> Result<PackedWeight, WeightError> {
    let bad = |reason: String| WeightError::Packing { reason };
    if sources.len() != pairing.sources() {
        return Err(bad(format!(
            "{pairing:?} takes {} source matrices, given {}",
            pairing.sources(),
            sources.len()
        )));
    }
    let (n, k) = sources[0].shape();
    let format = sources[0].format();
    for s in sources {
        if s.shape() != (n, k) || s.format() != format {
            return Err(bad(format!(
                "sources of one packed weight must share shape and format: {:?} {:?} and {:?} {:?}",
                (n, k),
                format,
                s.shape(),
                s.format()
            )));
        }
        let stored = match s {
            SourceWeight::Fp8(w) => {
                let expect = scale_shape(w.rows, w.cols);
                if w.scales.len() != expect[0] * expect[1] {
                    return Err(bad(format!(
                        "[{n}, {k}] FP8 weight with {} scales, expected {expect:?}",
                        w.scales.len()
                    )));
                }
                w.codes.len()
            }
            SourceWeight::Bf16 { bits, .. } => bits.len(),
        };
        if stored != n * k {
            return Err(bad(format!("[{n}, {k}] weight holds {stored} elements")));
        }
    }
    let layout = PackedLayout::new(format, pairing, n, k)?;
    let mut bytes = vec![0u8; layout.bytes()];
    let eb = layout.element_bytes();
    for (source, s) in sources.iter().enumerate() {
        for row in 0..n {
            for kk in 0..k {
                let at = layout.position(source, row, kk) * eb;
                match s {
                    SourceWeight::Fp8(w) => bytes[at] = w.codes[row * k + kk],
                    SourceWeight::Bf16 { bits, .. } => {
                        bytes[at..at + 2].copy_from_slice(&bits[row * k + kk].to_le_bytes())
                    }
                }
            }
        }
    }
    let mut scales = vec![0f32; layout.scales_len()];
    if let (WeightFormat::Fp8, true) = (format, !scales.is_empty()) {
        let block_cols = scale_shape(n, k)[1];
        for tile in 0..layout.tiles() {
            for kb in 0..layout.k_blocks() {
                for half in 0..2 {
                    let (source, row) = layout.source_row(tile, half * HALF_ROWS);
                    if row >= n {
                        continue;
                    }
                    let SourceWeight::Fp8(w) = sources[source] else {
                        unreachable!("format checked above")
                    };
                    scales[layout.scale_index(tile, kb, half)] =
                        w.scales[(row / WEIGHT_BLOCK) * block_cols + kb];
                }
            }
        }
    }
    Ok(PackedWeight {
        layout,
        bytes,
        scales,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_of_the_glm_shapes() {
        // q_a at TP 8: 2048 x 6144 FP8 is 128 tiles of 48 k-blocks of 2 KB.
        let q_a = PackedLayout::new(WeightFormat::Fp8, Pairing::Plain, 2048, 6144).unwrap();
        assert_eq!(
            (q_a.tiles(), q_a.k_blocks(), q_a.block_bytes()),
            (128, 48, 2048)
        );
        assert_eq!(q_a.bytes(), 2048 * 6144);
        // An expert's gate/up at TP 8: 256 rows each, 32 tiles of 8 + 8 rows.
        let gu = PackedLayout::new(WeightFormat::Fp8, Pairing::GateUp, 256, 6144).unwrap();
        assert_eq!(gu.tiles(), 32);
        assert_eq!(gu.bytes(), 2 * 256 * 6144);
        let bf = PackedLayout::new(WeightFormat::Bf16, Pairing::Plain, 200, 256).unwrap();
        assert_eq!(
            (bf.tiles(), bf.block_bytes(), bf.loads_per_block()),
            (13, 4096, 8)
        );
        assert!(PackedLayout::new(WeightFormat::Fp8, Pairing::Plain, 16, 100).is_err());
    }
}
