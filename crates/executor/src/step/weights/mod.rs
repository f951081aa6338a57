//! One rank's weights on the device: where each tensor lives ([`plan`]), synthetic values made
//! there by a hash kernel ([`generate`]), what they must equal by the CPU's rule ([`check`]), and
//! the memory pages a step's weights lie in ([`pages`]).

pub mod check;
pub mod generate;
pub mod pages;
pub mod plan;

pub use generate::{DeviceWeights, Progress, WeightKernels};
pub use plan::{DeviceTensor, Element, Form, Shard, WeightPlan};

#[cfg(test)]
mod tests {
    use super::check::{expected, shard_values};
    use super::plan::{Element, Form, WeightPlan};
    use model::weights::packed::{pack, Pairing, SourceWeight};
    use model::weights::{checkpoint_tensors, synthetic_values, Synthetic};
    use model::{ModelConfig, WeightFormat};

    #[test]
    fn tiny_fp8_packed_weights_equal_the_synthetic_source_packed() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let plan = WeightPlan::new(&cfg, 1, 0, WeightFormat::Fp8).unwrap();
        let synthetic = Synthetic::new(&cfg, 5, WeightFormat::Fp8).unwrap();
        let specs = checkpoint_tensors(&cfg).unwrap();
        let spec = |name: &str| specs.iter().find(|s| s.name == name).unwrap().clone();
        for name in [
            "model.layers.0.self_attn.q_a_proj.weight",
            "model.layers.3.mlp.experts.5.gate_proj.weight",
        ] {
            let tensor = plan.get(name).unwrap();
            let Form::Packed(layout) = tensor.form else {
                panic!("{name} is not packed")
            };
            let sources: Vec<_> = tensor
                .sources
                .iter()
                .map(|s| synthetic.fp8(&spec(&s.name)).unwrap())
                .collect();
            let refs: Vec<SourceWeight> = sources.iter().map(SourceWeight::Fp8).collect();
            let want = pack(layout.pairing, &refs).unwrap();
            let got = expected(5, tensor).unwrap();
            assert_eq!((got.0, got.1), (want.bytes, want.scales), "{name}");
        }
        let gate_up = plan
            .get("model.layers.3.mlp.experts.5.up_proj.weight")
            .unwrap();
        assert_eq!(
            gate_up.name,
            "model.layers.3.mlp.experts.5.gate_up_proj.weight"
        );
        assert!(matches!(gate_up.form, Form::Packed(l) if l.pairing == Pairing::GateUp));
    }

    #[test]
    fn shards_are_the_ranks_rows_or_columns_of_the_whole_tensor() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let whole = |name: &str| {
            let spec = checkpoint_tensors(&cfg)
                .unwrap()
                .into_iter()
                .find(|s| s.name == name)
                .unwrap();
            (synthetic_values(9, name, &spec.shape), spec.shape)
        };
        let plan = WeightPlan::new(&cfg, 4, 2, WeightFormat::Bf16).unwrap();
        // o_proj splits its columns: rank 2 of 4 holds columns 512..768 of 1024.
        let name = "model.layers.1.self_attn.o_proj.weight";
        let shard = &plan.get(name).unwrap().sources[0];
        let (values, shape) = whole(name);
        assert_eq!((shard.row0, shard.col0, shard.cols), (0, 512, 256));
        let want: Vec<f32> = (0..shape[0])
            .flat_map(|r| values[r * shape[1] + 512..r * shape[1] + 768].to_vec())
            .collect();
        assert_eq!(shard_values(9, shard), want);
        // q_b_proj splits its rows (heads).
        let name = "model.layers.1.self_attn.q_b_proj.weight";
        let shard = &plan.get(name).unwrap().sources[0];
        let (values, shape) = whole(name);
        let (r0, rows) = (shard.row0, shard.rows);
        assert_eq!(r0, 2 * shape[0] / 4);
        assert_eq!(
            shard_values(9, shard),
            values[r0 * shape[1]..(r0 + rows) * shape[1]]
        );
        // Vectors are whole on every rank.
        let norm = &plan.get("model.norm.weight").unwrap();
        assert_eq!(norm.element, Element::Bf16);
        assert_eq!(
            shard_values(9, &norm.sources[0]),
            whole("model.norm.weight").0
        );
    }

    #[test]
    fn the_plan_places_every_tensor_once_without_overlap() {
        let cfg = ModelConfig::preset("glm-5.2").unwrap();
        let plan = WeightPlan::new(&cfg, 8, 7, WeightFormat::Fp8).unwrap();
        let mut ranges: Vec<(usize, usize)> = plan
            .tensors
            .iter()
            .flat_map(|t| {
                std::iter::once((t.offset, t.offset + t.bytes))
                    .chain(t.scales.map(|(at, n)| (at, at + 4 * n)))
            })
            .collect();
        ranges.sort_unstable();
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0));
        assert!(ranges.iter().all(|r| r.0 % super::plan::ALIGN == 0));
        let sources: usize = plan.tensors.iter().map(|t| t.sources.len()).sum();
        assert_eq!(sources, checkpoint_tensors(&cfg).unwrap().len());
        // About 93 GB: what one H200 holds with room to spare.
        let gb = plan.bytes as f64 / 1e9;
        assert!((85.0..100.0).contains(&gb), "{gb} GB");
    }

    #[test]
    fn fp8_shards_off_the_scale_blocks_are_refused_by_name() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let err = WeightPlan::new(&cfg, 2, 1, WeightFormat::Fp8).unwrap_err();
        assert!(err.to_string().contains("scale blocks"), "{err}");
        assert!(WeightPlan::new(&cfg, 2, 1, WeightFormat::Bf16).is_ok());
        assert!(WeightPlan::new(&cfg, 2, 2, WeightFormat::Bf16).is_err());
    }
}
