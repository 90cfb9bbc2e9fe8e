//! Consumer groups: one per pipeline. Two pipelines in one group would
//! split each other's partitions between them, each taking messages the
//! other was meant to handle, so a config that shares a group is rejected.

use super::{DelayRelay, Route};
use std::collections::{BTreeMap, BTreeSet};

/// Adds a problem for every consumer group that more than one pipeline
/// (route, or the delay relay) uses, naming all of them and the group. Two
/// routes with one name are reported as such already, not again here.
pub(super) fn check_groups(
    routes: &[Route],
    delay: Option<&DelayRelay>,
    problems: &mut Vec<String>,
) {
    let mut users: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for route in routes {
        users
            .entry(route.group.as_str())
            .or_default()
            .insert(format!("route `{}`", route.name));
    }
    if let Some(relay) = delay {
        users
            .entry(relay.group.as_str())
            .or_default()
            .insert("the delay relay".to_string());
    }
    for (group, users) in users {
        let users: Vec<String> = users.into_iter().collect();
        if users.len() > 1 {
            problems.push(format!(
                "{} share consumer group `{group}`: give each its own `group`",
                and_list(&users)
            ));
        }
    }
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    fn problems(body: &str) -> Vec<String> {
        crate::config::resolve_with_handler(body)
            .err()
            .unwrap_or_default()
    }

    fn route(name: &str, extra: &str) -> String {
        format!(
            "[[route]]\nname = \"{name}\"\ntopics = [\"{name}-in\"]\nhandler = \"h.wasm\"\n{extra}\n"
        )
    }

    #[test]
    fn two_routes_in_one_group_are_rejected_naming_both() {
        let body = route("orders", "group = \"shared\"")
            + &route("payments", "group = \"shared\"")
            + &route("refunds", "");
        let problems = problems(&body);
        assert_eq!(
            problems,
            vec![
                "route `orders` and route `payments` share consumer group `shared`: give each its own `group`"
                    .to_string()
            ]
        );
    }

    #[test]
    fn a_route_in_the_relays_group_is_rejected() {
        let body = route("orders", "group = \"hopper.delay\"") + "[delay]\n";
        let problems = problems(&body);
        assert_eq!(
            problems,
            vec![
                "route `orders` and the delay relay share consumer group `hopper.delay`: give each its own `group`"
                    .to_string()
            ]
        );
    }

    #[test]
    fn a_route_named_delay_takes_the_relays_group() {
        let found = problems(&(route("delay", "") + "[delay]\n"));
        assert!(
            found.iter().any(|p| p
                == "route `delay` and the delay relay share consumer group `hopper.delay`: give each its own `group`"),
            "{found:?}"
        );
        assert!(
            problems(&(route("delay", "") + "[delay]\ngroup = \"relay\"\n"))
                .iter()
                .all(|p| !p.contains("consumer group")),
            "a relay with its own group does not clash"
        );
    }

    #[test]
    fn a_repeated_route_name_is_reported_once() {
        let problems = problems(&(route("orders", "") + &route("orders", "")));
        assert!(
            problems
                .iter()
                .any(|p| p.contains("name is used by route #1")),
            "{problems:?}"
        );
        assert!(
            problems.iter().all(|p| !p.contains("consumer group")),
            "{problems:?}"
        );
    }

    #[test]
    fn distinct_groups_pass() {
        let body = route("orders", "") + &route("payments", "") + "[delay]\n";
        assert!(problems(&body).is_empty());
    }
}
