//! `foresight journal` and `foresight replay`: a parameter server's update journal read back.

use std::io::Write;
use std::path::Path;

use foresight_ps::journal::{self, Filter, Line};
use foresight_ps::store::journal::Entry;

/// Prints the entries `filter` selects, or the summary.
pub fn show(dir: &Path, filter: &Filter, summary: bool, json: bool) {
    let lines = journal::read(dir).unwrap_or_else(|e| fail(e));
    let selected: Vec<Line> = lines.into_iter().filter(|l| filter.matches(l)).collect();
    if summary {
        let s = journal::summarize(&selected);
        if json {
            println!("{}", serde_json::to_string(&s).expect("plain data"));
        } else {
            print_summary(&s);
        }
        return;
    }
    let mut out = std::io::stdout().lock();
    for line in &selected {
        let text = if json { serde_json::to_string(line).expect("plain data") } else { describe(line) };
        // A reader that stopped reading (`| head`) ends the listing.
        if writeln!(out, "{text}").is_err() {
            return;
        }
    }
}

/// Replays the journal and says whether it reproduces the checkpoint; exits 1 when not.
pub fn replay(dir: &Path) {
    let r = journal::replay(dir).unwrap_or_else(|e| fail(e));
    let lost = if r.lost > 0 { format!(" ({} lost in restarts)", r.lost) } else { String::new() };
    println!("replayed {} updates to version {}{lost}", r.updates, r.version);
    match (r.checkpoint_version, &r.first_difference) {
        (None, _) => println!("no checkpoint in {} to compare with", dir.display()),
        (Some(v), None) if v == r.version => {
            println!("identical to the checkpoint of version {v}, bit for bit")
        }
        (Some(v), Some(d)) => println!("differs from the checkpoint of version {v}: first at {d}"),
        (Some(v), None) => println!("the checkpoint is at version {v}"),
    }
    if !r.reproduces() {
        std::process::exit(1);
    }
}

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("foresight: {e}");
    std::process::exit(2);
}

fn describe(line: &Line) -> String {
    let who = |w: &usize, g: &Option<u64>, seq: &u64| match g {
        Some(g) => format!("worker {w} gen {g} seq {seq}"),
        None => format!("worker {w} seq {seq}"),
    };
    let what = match &line.entry {
        Entry::Started { version, how } => format!("started    v{version} ({how:?})"),
        Entry::Applied { version, worker, generation, seq, staleness, lr, body, .. } => {
            let bytes = body.map_or(String::new(), |b| format!(" {} B", b.bytes));
            format!("applied    v{version} {} τ={staleness} η={lr}{bytes}", who(worker, generation, seq))
        }
        Entry::Contributed { round, worker, generation, seq, .. } => {
            format!("contribute round v{round} {}", who(worker, generation, seq))
        }
        Entry::Round { version, workers, short, mean_over, .. } => {
            let short = if *short { " (short)" } else { "" };
            // A round of fewer gradients than a whole one steps that much less.
            let share = match mean_over {
                Some(n) if *n > workers.len() => format!(", step {}/{n}", workers.len()),
                _ => String::new(),
            };
            format!("round      v{version} from workers {workers:?}{short}{share}")
        }
        Entry::Refused { worker, generation, seq, computed_on, at_version, reason } => format!(
            "refused    at v{at_version} {} computed on v{computed_on}: {reason}",
            who(worker, generation, seq)
        ),
        Entry::Reseeded { version, .. } => format!("reseeded   v{version} from a worker's copy"),
        Entry::Silence { worker, silent: true } => {
            format!("silent     worker {worker}: nothing heard for the silence timeout")
        }
        Entry::Silence { worker, silent: false } => format!("heard      worker {worker} again"),
        Entry::Gap { entries } => format!("gap        {entries} entries could not be written (a full disk)"),
    };
    format!("{} shard {} {what}", line.t_ms, line.shard)
}

fn print_summary(s: &journal::Summary) {
    println!(
        "{} entries: {} updates ({} sync rounds, {} short), {} restarts, {} re-seeds, {} missing, last version {}",
        s.entries, s.updates, s.rounds, s.rounds_short, s.restarts, s.reseeds, s.missing, s.last_version
    );
    let head = ("worker", "applied", "contributed", "τ mean", "τ max", "silent");
    println!(
        "{:>6} {:>8} {:>11} {:>7} {:>7} {:>6}  generations  refused",
        head.0, head.1, head.2, head.3, head.4, head.5
    );
    for (w, ws) in &s.workers {
        let refused: Vec<String> = ws.refused.iter().map(|(r, n)| format!("{r}={n}")).collect();
        println!(
            "{w:>6} {:>8} {:>11} {:>7.2} {:>7} {:>6}  {:<11}  {}",
            ws.applied,
            ws.contributed,
            ws.mean_staleness,
            ws.max_staleness,
            ws.silences,
            format!("{:?}", ws.generations),
            refused.join(" ")
        );
    }
}
