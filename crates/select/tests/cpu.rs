//! The CPU forms of the kernels (one CTA; registers; multi-slice on threads and the mailbox protocol) give the
//! reference's list entry by entry, on random rows, lengths, k, slice counts and page tables.

use mailbox::layout::ScratchLayout;
use mailbox::Scratch;
use proptest::prelude::*;
use select::cases::{self, Pattern};
use select::check::check_output;
use select::cpu::{select_in_registers, select_multi_slice, select_one_cta, CpuError, Exchanged};
use select::layout::{
    select_slices, LayoutError, SelectBoxes, Slices, TopK, MAX_SLICES, ONE_CTA_ROOM, REG_MAX_ROW,
};
use select::reference::{Pages, Rows};

/// A kernel's CPU form over whole rows.
type Form = fn(&Rows, TopK, Option<&Pages>) -> Result<Vec<i32>, CpuError>;

/// The largest slice count up to `want` that the row accepts.
fn slicing(len: u32, want: u32) -> Slices {
    (1..=want.clamp(1, MAX_SLICES))
        .rev()
        .find_map(|c| Slices::new(len, c).ok())
        .unwrap()
}

struct Case {
    scores: Vec<f32>,
    stride: usize,
    lens: Vec<u32>,
    table: Vec<i32>,
    pages_per_row: usize,
}

impl Case {
    fn new(pattern: Pattern, lens: Vec<u32>, seed: u64) -> Case {
        let stride = *lens.iter().max().unwrap() as usize + 3;
        let pages_per_row = stride.div_ceil(64);
        // A scrambled page table: page p of row r is (p * 7 + r * 13) % pages + 1000 * r.
        let table = (0..lens.len() * pages_per_row)
            .map(|i| {
                let (r, p) = (i / pages_per_row, i % pages_per_row);
                ((p * 7 + r * 13) % pages_per_row + 1000 * r) as i32
            })
            .collect();
        Case {
            scores: cases::rows(pattern, &lens, stride, seed),
            stride,
            lens,
            table,
            pages_per_row,
        }
    }

    fn rows(&self) -> Rows<'_> {
        Rows {
            scores: &self.scores,
            stride: self.stride,
            lens: &self.lens,
        }
    }

    fn pages(&self) -> Pages<'_> {
        Pages {
            table: &self.table,
            stride: self.pages_per_row,
        }
    }

    fn multi(
        &self,
        top: TopK,
        pages: bool,
        slicing: &[Slices],
        tag: u32,
        scratch: &Scratch,
    ) -> Result<Vec<i32>, CpuError> {
        let mut b = ScratchLayout::builder();
        let boxes = SelectBoxes::add(&mut b, "sel", self.lens.len() as u32, top).unwrap();
        assert!(scratch.len() >= b.build().boxes() as usize);
        let via = Exchanged {
            scratch,
            boxes: &boxes,
            tag,
        };
        let p = self.pages();
        select_multi_slice(&self.rows(), top, pages.then_some(&p), slicing, &via)
    }
}

fn scratch_for(rows: u32, top: TopK) -> Scratch {
    let mut b = ScratchLayout::builder();
    SelectBoxes::add(&mut b, "sel", rows, top).unwrap();
    Scratch::new(b.build().boxes())
}

fn pattern() -> impl Strategy<Value = Pattern> {
    prop::sample::select(Pattern::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn multi_slice_equals_the_reference(
        pattern in pattern(),
        lens in prop::collection::vec(0..6000u32, 1..4),
        k in 1..=80u32,
        slices in prop::collection::vec(1..=MAX_SLICES, 3),
        pages in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let top = TopK::new(k).unwrap();
        let case = Case::new(pattern, lens.clone(), seed);
        let slicing: Vec<Slices> = lens.iter().zip(&slices).map(|(&l, &s)| slicing(l, s)).collect();
        let scratch = scratch_for(lens.len() as u32, top);
        let got = case.multi(top, pages, &slicing, 1, &scratch).unwrap();
        let p = case.pages();
        check_output(&case.rows(), top, pages.then_some(&p), &got).unwrap();
    }

    #[test]
    fn one_cta_and_registers_equal_the_reference(
        pattern in pattern(),
        // Rows past ONE_CTA_ROOM stream (6-bit rounds and the wide tail); shorter ones stay in LDS.
        // The registers form takes the same lengths cut to what it holds.
        lens in prop::collection::vec(0..40000u32, 1..4),
        k in 1..=300u32,
        pages in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let top = TopK::new(k).unwrap();
        let held: Vec<u32> = lens.iter().map(|&l| l % (REG_MAX_ROW + 1)).collect();
        for (form, lens) in [(select_one_cta as Form, lens), (select_in_registers as Form, held)] {
            let case = Case::new(pattern, lens, seed);
            let p = case.pages();
            let got = form(&case.rows(), top, pages.then_some(&p)).unwrap();
            check_output(&case.rows(), top, pages.then_some(&p), &got).unwrap();
        }
    }
}

/// Every pattern over rows of `lens` at production k through `run`, checked against the
/// reference; the stops the rows took.
fn stops_checked(lens: &[u32], seed: u64, run: impl Fn(&Case) -> Vec<i32>) -> Vec<Option<u32>> {
    let top = TopK::GLM5;
    let mut stops = std::collections::BTreeSet::new();
    for (i, pattern) in Pattern::ALL.into_iter().enumerate() {
        let case = Case::new(pattern, lens.to_vec(), seed + i as u64);
        for row in 0..lens.len() {
            let sel = select::select_row(case.rows().row(row), top).unwrap();
            stops.insert(sel.threshold.map(|t| t.prefix_bits));
        }
        check_output(&case.rows(), top, None, &run(&case))
            .unwrap_or_else(|e| panic!("{}: {e}", pattern.name()));
    }
    stops.into_iter().collect()
}

/// The registers kernel's steps at production k: every stop, rows of k + 1 and of the most it
/// holds; a longer row is refused, not cut.
#[test]
fn registers_stop_at_12_24_and_32_bits_and_refuse_longer_rows() {
    let top = TopK::GLM5;
    let stops = stops_checked(&[8192, 2049, REG_MAX_ROW, 4097], 70, |case| {
        select_in_registers(&case.rows(), top, None).unwrap()
    });
    assert_eq!(stops, [Some(12), Some(24), Some(32)]);
    let long = Case::new(Pattern::Random, vec![100, REG_MAX_ROW + 1], 1);
    assert!(matches!(
        select_in_registers(&long.rows(), top, None),
        Err(CpuError::Layout(LayoutError::TooLongForRegisters { .. }))
    ));
}

/// Production k over the production slicing, every pattern, rows that stop at 12, 24 and 32 bits.
#[test]
fn production_shapes_on_64_slices() {
    let top = TopK::GLM5;
    // 64 slices (past 64 x SLICE_TARGET keys), 3 slices, and rows of one slice each side of k.
    let lens = vec![600_000, 2048, 2049, 20_000];
    let scratch = scratch_for(lens.len() as u32, top);
    let mut stops = std::collections::BTreeSet::new();
    for (i, pattern) in Pattern::ALL.into_iter().enumerate() {
        let case = Case::new(pattern, lens.clone(), 7 + i as u64);
        for row in 0..lens.len() {
            let sel = select::select_row(case.rows().row(row), top).unwrap();
            stops.insert(sel.threshold.map(|t| t.prefix_bits));
        }
        let slicing: Vec<Slices> = lens.iter().map(|&l| select_slices(l).unwrap()).collect();
        assert_eq!(slicing[0].count(), 64);
        // Every pattern reuses the scratch under a new tag, as launches do.
        let got = case
            .multi(top, false, &slicing, 1 + i as u32, &scratch)
            .unwrap();
        check_output(&case.rows(), top, None, &got)
            .unwrap_or_else(|e| panic!("{}: {e}", pattern.name()));
        let one = select_one_cta(&case.rows(), top, None).unwrap();
        assert_eq!(one, got, "{}", pattern.name());
    }
    assert_eq!(
        stops.into_iter().collect::<Vec<_>>(),
        [None, Some(12), Some(24), Some(32)]
    );
}

/// The one CTA over rows kept in LDS (at most ONE_CTA_ROOM keys) at production k: every stop,
/// and rows of k + 1 and exactly the room.
#[test]
fn one_cta_in_lds_stops_at_12_24_and_32_bits() {
    let stops = stops_checked(&[8192, 2049, ONE_CTA_ROOM, 4097], 40, |case| {
        select_one_cta(&case.rows(), TopK::GLM5, None).unwrap()
    });
    assert_eq!(stops, [Some(12), Some(24), Some(32)]);
}

#[test]
fn nan_among_the_keys_is_reported_not_past_them() {
    let top = TopK::new(4).unwrap();
    let mut case = Case::new(Pattern::Random, vec![3000, 50], 3);
    // Past the length: ignored.
    case.scores[case.stride + 60] = f32::NAN;
    let slicing = [slicing(3000, 3), slicing(50, 1)];
    let scratch = scratch_for(2, top);
    assert!(case.multi(top, false, &slicing, 1, &scratch).is_ok());
    case.scores[1234] = f32::NAN;
    assert_eq!(
        case.multi(top, false, &slicing, 2, &scratch),
        Err(CpuError::Nan { row: 0 })
    );
    assert_eq!(
        select_one_cta(&case.rows(), top, None),
        Err(CpuError::Nan { row: 0 })
    );
}

#[test]
fn a_stale_scratch_is_not_read_as_this_launch() {
    // Boxes left by a launch with tag 5 do not satisfy a launch with tag 6: it recomputes and
    // still matches. A wrong slice count in one row stalls rather than reading a stale box.
    let top = TopK::new(16).unwrap();
    let case = Case::new(Pattern::Ties, vec![9000], 11);
    let scratch = scratch_for(1, top);
    let s = [slicing(9000, 9)];
    let first = case.multi(top, false, &s, 5, &scratch).unwrap();
    let second = case.multi(top, false, &s, 6, &scratch).unwrap();
    assert_eq!(first, second);
}
