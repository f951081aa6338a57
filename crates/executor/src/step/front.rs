//! The fused front half (indexer scoring and top-k select in one launch) as a launch of the step.

use device::Stream;

use super::graph::{Output, StepLaunch};
use super::{Result, StepError};
use crate::fused::front_gpu::{FrontKernel, FrontLaunch};

/// A front-half launch built against its step slot (`FrontLaunch::in_step`).
pub struct FrontStep<'a> {
    pub name: String,
    pub kernel: &'a FrontKernel,
    pub launch: FrontLaunch<'a>,
}

impl StepLaunch for FrontStep<'_> {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn kind(&self) -> String {
        "front half".into()
    }

    fn enqueue(&self, stream: &Stream) -> Result<()> {
        Ok(self.launch.enqueue_launch(self.kernel, stream)?)
    }

    fn outputs(&self) -> Vec<Output<'_>> {
        vec![
            Output::new("scores", &self.launch.scores),
            Output::new("top-k slots", &self.launch.out),
        ]
    }

    fn floor_bytes(&self) -> Option<u64> {
        Some(
            self.launch
                .graph
                .floor_bytes(self.kernel.dims().head_dim as u32),
        )
    }

    fn check(&self) -> Result<()> {
        self.launch
            .read(self.kernel)
            .map(|_| ())
            .map_err(StepError::from)
    }
}
