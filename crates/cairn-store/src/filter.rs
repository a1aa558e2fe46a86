//! The `WHERE` clause of a [`ListQuery`], shared by the SQL backends so that a listing and
//! its count can never disagree about which rows match.

use crate::ListQuery;

/// A value bound to one placeholder of [`SqlFilter::clause`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlArg {
    /// A `BIGINT` / `INTEGER`.
    Int(i64),
    /// A `TEXT`.
    Text(String),
}

/// The conditions of a listing: `clause` is `true AND …` with numbered placeholders, and
/// `args` their values, in placeholder order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlFilter {
    /// `true AND workflow = ?1 AND …`.
    pub clause: String,
    /// The value of placeholder `i + 1` at index `i`.
    pub args: Vec<SqlArg>,
}

impl ListQuery {
    /// The conditions of this query over the `instances` table, with placeholders named by
    /// `placeholder(n)` (1-based: `?1` for SQLite, `$1` for PostgreSQL). `limit` is not part
    /// of it; `after` is when `paged`.
    pub fn sql_filter(&self, paged: bool, placeholder: fn(usize) -> String) -> SqlFilter {
        let mut clause = String::from("true");
        let mut args = Vec::new();
        let mut bind = |clause: &mut String, condition: &str, arg: SqlArg| {
            args.push(arg);
            clause.push_str(&condition.replace('#', &placeholder(args.len())));
        };
        if let Some(workflow) = &self.workflow {
            bind(
                &mut clause,
                " AND workflow = #",
                SqlArg::Text(workflow.to_string()),
            );
        }
        match self.statuses.as_slice() {
            [] => {}
            [one] => bind(&mut clause, " AND status = #", SqlArg::Int(one.code())),
            many => {
                // `+status`: not a term an index serves, so the planner reads the listing's
                // own order (`(workflow, iid)` or `iid`) and filters, rather than merging
                // several status ranges and sorting all of them for one page.
                clause.push_str(" AND +status IN (");
                for (i, status) in many.iter().enumerate() {
                    let sep = if i == 0 { "#" } else { ", #" };
                    bind(&mut clause, sep, SqlArg::Int(status.code()));
                }
                clause.push(')');
            }
        }
        if let Some(from) = self.created_from {
            bind(
                &mut clause,
                " AND created_at >= #",
                SqlArg::Int(from.as_millis()),
            );
        }
        if let Some(before) = self.created_before {
            bind(
                &mut clause,
                " AND created_at < #",
                SqlArg::Int(before.as_millis()),
            );
        }
        if let Some(prefix) = self.id_prefix.as_deref().filter(|p| !p.is_empty()) {
            // Ids are ASCII (`InstanceId`), so the first `len` characters are the first
            // `len` bytes, compared exactly by both backends: no LIKE, whose wildcards and
            // case rules differ between them.
            bind(
                &mut clause,
                " AND substr(id, 1, length(#)) = #",
                SqlArg::Text(prefix.to_owned()),
            );
        }
        if let Some(after) = self.after.filter(|_| paged) {
            let condition = if self.oldest_first {
                " AND iid > #"
            } else {
                " AND iid < #"
            };
            bind(&mut clause, condition, SqlArg::Int(after.0));
        }
        SqlFilter { clause, args }
    }
}

#[cfg(test)]
mod tests {
    use cairn_core::{InstanceStatus, Timestamp, WorkflowName};

    use super::*;
    use crate::InstanceRef;

    fn question(n: usize) -> String {
        format!("?{n}")
    }

    #[test]
    fn every_condition_gets_the_next_placeholder_in_order() {
        let query = ListQuery {
            workflow: Some(WorkflowName::new("wf").unwrap()),
            statuses: vec![InstanceStatus::Running, InstanceStatus::Errored],
            created_from: Some(Timestamp::from_millis(10)),
            created_before: Some(Timestamp::from_millis(20)),
            id_prefix: Some("ord-".into()),
            after: Some(InstanceRef(7)),
            oldest_first: false,
            limit: 5,
        };
        let f = query.sql_filter(true, question);
        assert_eq!(
            f.clause,
            "true AND workflow = ?1 AND +status IN (?2, ?3) AND created_at >= ?4 \
             AND created_at < ?5 AND substr(id, 1, length(?6)) = ?6 AND iid < ?7"
        );
        assert_eq!(f.args.len(), 7);
        assert_eq!(f.args[5], SqlArg::Text("ord-".into()));
        let unpaged = query.sql_filter(false, question);
        assert!(!unpaged.clause.contains("iid"));
        let oldest_first = ListQuery {
            oldest_first: true,
            ..query
        };
        assert!(
            oldest_first
                .sql_filter(true, question)
                .clause
                .ends_with(" AND iid > ?7")
        );
    }

    #[test]
    fn an_empty_query_matches_everything() {
        let f = ListQuery::default().sql_filter(true, question);
        assert_eq!(f.clause, "true");
        assert!(f.args.is_empty());
    }
}
