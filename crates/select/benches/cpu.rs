//! The CPU side of the select stage: the reference, and the one-CTA, registers and multi-slice
//! kernels in CPU form (the last on one thread per slice through the mailbox protocol); the
//! registers form on the rows it takes (16K keys).
//! `cargo bench -p select --bench cpu`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use mailbox::layout::ScratchLayout;
use mailbox::Scratch;
use select::cases::Pattern;
use select::cpu::{select_in_registers, select_multi_slice, select_one_cta, Exchanged};
use select::layout::{select_slices, SelectBoxes, Slices, TopK, REG_MAX_ROW};
use select::reference::{select_rows, Rows};
use std::time::Duration;

fn cpu(c: &mut Criterion) {
    let top = TopK::GLM5;
    let mut g = c.benchmark_group("select_cpu");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    for (rows, len) in [(1usize, 131072u32), (4, 32768), (4, REG_MAX_ROW)] {
        let lens = vec![len; rows];
        let scores = select::cases::rows(Pattern::Random, &lens, len as usize, 1);
        let r = Rows {
            scores: &scores,
            stride: len as usize,
            lens: &lens,
        };
        let id = format!("{rows}x{len}");
        g.bench_with_input(BenchmarkId::new("reference", &id), &r, |b, r| {
            b.iter(|| select_rows(r, top, None).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("one_cta", &id), &r, |b, r| {
            b.iter(|| select_one_cta(r, top, None).unwrap())
        });
        if len <= REG_MAX_ROW {
            g.bench_with_input(BenchmarkId::new("registers", &id), &r, |b, r| {
                b.iter(|| select_in_registers(r, top, None).unwrap())
            });
        }
        let mut builder = ScratchLayout::builder();
        let boxes = SelectBoxes::add(&mut builder, "sel", rows as u32, top).unwrap();
        let scratch = Scratch::new(builder.build().boxes());
        let slicing: Vec<Slices> = lens.iter().map(|&l| select_slices(l).unwrap()).collect();
        let mut tag = 0u32;
        g.bench_with_input(BenchmarkId::new("multi_slice", &id), &r, |b, r| {
            b.iter(|| {
                tag += 1;
                let via = Exchanged {
                    scratch: &scratch,
                    boxes: &boxes,
                    tag,
                };
                select_multi_slice(r, top, None, &slicing, &via).unwrap()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, cpu);
criterion_main!(benches);
