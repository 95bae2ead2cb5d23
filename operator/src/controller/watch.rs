//! Which TrainingJobs the operator handles: every namespace's, or a list of namespaces (one
//! set of watches each, for an operator that only has a Role in each).

/// Which TrainingJobs the operator handles.
#[derive(Clone, Debug, PartialEq)]
pub enum Watch {
    /// Those of every namespace (cluster-wide RBAC).
    All,
    /// Those of these namespaces only (a Role in each): one set of watches per namespace.
    Namespaces(Vec<String>),
}

impl Watch {
    /// From `--namespace`'s comma-separated list; empty: every namespace.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut names: Vec<String> =
            list.split(',').map(str::trim).filter(|n| !n.is_empty()).map(String::from).collect();
        if let Some(bad) = names.iter().find(|n| !crate::api::is_dns_name(n, 63, false)) {
            return Err(format!(
                "--namespace: {bad:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
            ));
        }
        names.sort();
        names.dedup();
        Ok(if names.is_empty() { Watch::All } else { Watch::Namespaces(names) })
    }

    /// One scope per set of watches: `None` is every namespace.
    pub(crate) fn scopes(&self) -> Vec<Option<String>> {
        match self {
            Watch::All => vec![None],
            Watch::Namespaces(names) => names.iter().cloned().map(Some).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_list_is_trimmed_sorted_and_deduplicated_and_empty_means_all() {
        assert_eq!(Watch::parse(""), Ok(Watch::All));
        assert_eq!(Watch::parse(" , "), Ok(Watch::All));
        assert_eq!(
            Watch::parse("team-b, team-a,team-b"),
            Ok(Watch::Namespaces(vec!["team-a".into(), "team-b".into()]))
        );
        for bad in ["Team", "a_b", "-a", &"a".repeat(64)] {
            let e = Watch::parse(&format!("ok,{bad}")).unwrap_err();
            assert!(e.contains("is not a namespace name"), "{bad}: {e}");
        }
    }
}
