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
