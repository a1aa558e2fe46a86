//! What the writer thread runs and answers: a job of a group commit.

use cairn_store::Result;

use crate::held::Writer;

/// A write job's work. One allocation per job, made by the caller: the writer thread, the
/// serial part, allocates nothing of its own to run a job and answer it.
pub(crate) trait Work: Send {
    /// Runs inside the group transaction; `Ok` keeps its writes, `Err` says why it failed.
    fn run(&mut self, conn: &Writer<'_>) -> std::result::Result<(), String>;
    /// Called once, after [`Work::run`], with the outcome of the commit the job was part
    /// of. A job dropped unrun is never called: dropping it tells its caller it failed.
    fn complete(self: Box<Self>, commit: Result<()>);
}

/// A write job.
pub(crate) struct WriteJob {
    pub(crate) work: Box<dyn Work>,
    /// It fails only before its first write (`worker`'s doc): no savepoint.
    pub(crate) fenced: bool,
}
