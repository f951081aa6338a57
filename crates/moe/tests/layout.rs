//! Dispatch lists every (row, routed slot) once, under the right expert, rows ascending.

use moe::{dispatch, Route};
use proptest::prelude::*;

proptest! {
    #[test]
    fn dispatch_covers_every_route_once(
        routes in prop::collection::vec(prop::collection::vec(0usize..16, 0..5), 0..12),
    ) {
        let routes: Vec<Vec<Route>> = routes
            .into_iter()
            .map(|r| r.into_iter().map(|expert| Route { expert, weight: 1.0 }).collect())
            .collect();
        let table = dispatch(&routes, 16).unwrap();
        let mut seen = 0;
        for (expert, served) in table.iter().enumerate() {
            prop_assert!(served.windows(2).all(|w| w[0] <= w[1]), "rows not ascending");
            for &(row, slot) in served {
                prop_assert_eq!(routes[row][slot].expert, expert);
                seen += 1;
            }
        }
        prop_assert_eq!(seen, routes.iter().map(Vec::len).sum::<usize>());
    }
}

#[test]
fn an_expert_out_of_range_is_an_error() {
    let routes = vec![vec![Route {
        expert: 16,
        weight: 1.0,
    }]];
    let message = dispatch(&routes, 16).unwrap_err().to_string();
    assert!(message.contains("expert 16 of 16"), "{message}");
}

mod launch {
    use linear::layout::{
        pair_range, KIND_EXPERT_PAIR, KIND_TILES, PAIR_PEERS_AFTER, PAIR_PEERS_BEFORE, PAIR_SLOT,
    };
    use mailbox::layout::{BoxRange, BOXES_PER_LINE};
    use mailbox::Limits;
    use model::WeightFormat;
    use moe::layout::{
        place, MoeShape, MoeStart, BANK_DOWN, BANK_GATE_UP, COMBINE_CHUNK, KIND_COMBINE,
        KIND_ROUTE, MAT_ROUTER, MAT_SHARED_DOWN, MAT_SHARED_GATE_UP,
    };
    use proptest::prelude::*;

    fn shape(rows: usize, experts: usize, top_k: usize, blocks: usize) -> MoeShape {
        MoeShape {
            rows,
            hidden: 128 * blocks,
            inter: 128,
            experts,
            top_k,
            n_group: 1,
            topk_group: 1,
            format: WeightFormat::Fp8,
        }
    }

    #[test]
    fn more_experts_or_groups_than_the_route_takes_are_refused() {
        use moe::layout::{ROUTE_MAX_EXPERTS, ROUTE_MAX_GROUPS};
        assert!(place(&shape(1, ROUTE_MAX_EXPERTS, 8, 1), 8, &MoeStart::default()).is_ok());
        let message = place(
            &shape(1, 2 * ROUTE_MAX_EXPERTS, 8, 1),
            8,
            &MoeStart::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(message.contains("512 experts"), "{message}");
        let mut grouped = shape(1, ROUTE_MAX_EXPERTS, 8, 1);
        (grouped.n_group, grouped.topk_group) = (2 * ROUTE_MAX_GROUPS, 4);
        let message = place(&grouped, 8, &MoeStart::default())
            .unwrap_err()
            .to_string();
        assert!(message.contains("in 64 groups"), "{message}");
    }

    /// GLM-5.2 at TP8 on 132 CTAs: the slots' pair tasks together take the grid at most once, and
    /// none holds more gate/up tiles than an even share of them all (at one row: 8 slots x 32
    /// tiles in 128 tasks of 2; splitting each over 132 / 9 = 14 CTAs gave some 3).
    #[test]
    fn the_slots_gate_ups_take_the_grid_once() {
        let cfg = model::ModelConfig::preset("glm-5.2").unwrap();
        let ctas = 132;
        for rows in [1, 2, 4] {
            let s = MoeShape::new(&cfg, 8, rows, WeightFormat::Fp8).unwrap();
            let plan = place(&s, ctas, &MoeStart::default()).unwrap();
            let gate_ups: Vec<u32> = plan
                .placement
                .tasks()
                .filter(|(_, t)| t.kind == KIND_EXPERT_PAIR)
                .map(|(_, t)| pair_range(t.args[1]).count)
                .collect();
            let tiles = s.slots() as u32 * s.gate_up_tiles();
            assert!(
                gate_ups.len() as u32 <= ctas,
                "{rows} rows: {}",
                gate_ups.len()
            );
            let most = gate_ups.iter().max().copied().unwrap_or(0);
            assert!(
                most <= tiles.div_ceil(ctas),
                "{rows} rows: a task of {most} tiles"
            );
        }
    }

    proptest! {
        /// Every tile of every matrix (the router's splits, the shared expert, each slot's gate/up
        /// and down) and every output column is some task's exactly once; the placement keeps the
        /// rule; one route task; each slot's pair tasks name their own slot, wait on its box, and
        /// form one gang whose members each wait on the lines of all the others.
        #[test]
        fn every_tile_and_column_once(
            rows in 1usize..=16,
            experts in prop::sample::select(vec![8usize, 16, 64, 256]),
            top_k in 1usize..=8,
            blocks in 1usize..=8,
            ctas in 1u32..=140,
        ) {
            prop_assume!(top_k <= experts);
            let s = shape(rows, experts, top_k, blocks);
            let plan = place(&s, ctas, &MoeStart::default()).unwrap();
            let valid = plan.placement.clone().check(Limits {
                max_resident: ctas,
                scratch_boxes: plan.end_box,
            });
            prop_assert!(valid.is_ok(), "{:?}", valid.err());
            let slots = s.slots() as u32;
            let splits = s.router_splits() as u32;
            let mut seen = std::collections::HashMap::new();
            let mut columns = vec![0u32; s.hidden];
            let mut routes = 0;
            let mut gangs: std::collections::HashMap<u32, Vec<u32>> = Default::default();
            for (_, t) in plan.placement.tasks() {
                if t.kind == KIND_TILES {
                    for tile in t.args[1]..t.args[1] + t.args[2] {
                        *seen.entry(((t.kind, t.args[0]), tile)).or_insert(0) += 1;
                    }
                } else if t.kind == KIND_EXPERT_PAIR {
                    let slot = t.args[0] >> 16;
                    prop_assert!(slot < slots);
                    prop_assert_eq!(t.args[0] & 0xffff, BANK_GATE_UP);
                    for (bank, arg) in [(BANK_GATE_UP, t.args[1]), (BANK_DOWN, t.args[2])] {
                        let r = pair_range(arg);
                        for tile in r.first..r.first + r.count {
                            *seen.entry(((t.kind, bank | slot << 16), tile)).or_insert(0) += 1;
                        }
                    }
                    let inputs = t.inputs();
                    prop_assert_eq!(inputs[PAIR_SLOT], BoxRange::new(plan.slots.first + slot, 1));
                    let gang = plan.experts[slot as usize];
                    prop_assert_eq!(t.out.len, BOXES_PER_LINE);
                    prop_assert!(gang.first <= t.out.first && t.out.end() <= gang.end());
                    prop_assert_eq!(inputs[PAIR_PEERS_BEFORE], BoxRange::new(gang.first, t.out.first - gang.first));
                    prop_assert_eq!(inputs[PAIR_PEERS_AFTER].first as u64, t.out.end());
                    prop_assert_eq!(inputs[PAIR_PEERS_AFTER].end(), gang.end());
                    gangs.entry(slot).or_default().push(t.order);
                } else if t.kind == KIND_ROUTE {
                    routes += 1;
                } else if t.kind == KIND_COMBINE {
                    prop_assert_eq!(t.args[0] % COMBINE_CHUNK, 0);
                    prop_assert_eq!(t.args[1] % COMBINE_CHUNK, 0);
                    for c in t.args[0]..t.args[0] + t.args[1] {
                        columns[c as usize] += 1;
                    }
                } else {
                    prop_assert!(false, "unknown kind {}", t.kind);
                }
            }
            prop_assert_eq!(routes, 1);
            prop_assert_eq!(gangs.len() as u32, slots);
            for (slot, orders) in &gangs {
                prop_assert!(orders.iter().all(|&o| o == orders[0]), "slot {} spans ranks", slot);
                prop_assert_eq!(orders.len() as u32 * BOXES_PER_LINE, plan.experts[*slot as usize].len);
            }
            prop_assert!(columns.iter().all(|&n| n == 1));
            let mut expect: Vec<((u32, u32), u32)> = Vec::new();
            for m in 0..splits {
                expect.push(((KIND_TILES, MAT_ROUTER + m), s.router_tiles()));
            }
            expect.push(((KIND_TILES, MAT_SHARED_GATE_UP), s.gate_up_tiles()));
            expect.push(((KIND_TILES, MAT_SHARED_DOWN), s.down_tiles()));
            for j in 0..slots {
                expect.push(((KIND_EXPERT_PAIR, BANK_GATE_UP | j << 16), s.gate_up_tiles()));
                expect.push(((KIND_EXPERT_PAIR, BANK_DOWN | j << 16), s.down_tiles()));
            }
            let total: u32 = expect.iter().map(|(_, n)| n).sum();
            prop_assert_eq!(seen.len() as u32, total);
            for (key, tiles) in expect {
                for tile in 0..tiles {
                    prop_assert_eq!(seen.get(&(key, tile)).copied(), Some(1), "{:?} tile {}", key, tile);
                }
            }
        }
    }
}
