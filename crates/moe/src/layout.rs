//! Dispatch: the rows each routed expert serves. Pure index math, shared by the reference, the
//! kernels (one task per expert with rows) and the executor's placement.

use crate::error::{invalid, Result};

/// One of a row's routed experts and its weight in the row's sum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Route {
    pub expert: usize,
    pub weight: f32,
}

/// For every expert, the (row, slot) pairs routed to it, rows ascending; `slot` indexes the row's
/// routes. Every (row, slot) appears exactly once. Experts are visited in ascending order by
/// whoever walks the result, which is also the order transformers sums a row's experts in.
pub fn dispatch(routes: &[Vec<Route>], experts: usize) -> Result<Vec<Vec<(usize, usize)>>> {
    let mut table = vec![Vec::new(); experts];
    for (row, row_routes) in routes.iter().enumerate() {
        for (slot, route) in row_routes.iter().enumerate() {
            let served = table.get_mut(route.expert).ok_or_else(|| {
                invalid(
                    "dispatch",
                    format!("row {row} routes to expert {} of {experts}", route.expert),
                )
            })?;
            served.push((row, slot));
        }
    }
    Ok(table)
}
