//! The proxy world's invariants (issue 27, item 5), judged from what the simulated client
//! read and wrote (per connection) and what each agent process wrote and received. Never
//! from the proxy's, the engine's or the core's view of themselves.
//!
//! - `P-answered-twice`: on one connection, no request of the client is answered twice,
//!   and nothing answers a request it never sent.
//! - `P-prompt-unanswered` (liveness): every prompt of the workload gets an answer (a
//!   `stopReason` or a JSON-RPC error) on some connection: one the client sent again
//!   after a crash of the proxy counts.
//! - `P-stop-unfounded`: a prompt answered `end_turn` was answered so by an agent that
//!   received it.
//! - `P-update-lost`: the updates the agent wrote for the prompt that completed the turn
//!   (answered `end_turn`) reach the client on that connection, each once, in order,
//!   before the answer.
//! - `P-update-altered`: an update of an agent reaches the client as the agent wrote it:
//!   the client decodes the same text (and tool-call input) the agent meant. The agents
//!   write escapes, unicode, backslash runs and nested JSON (`palisade_testkit::wire_text`),
//!   so a reader of the wire that mis-reads them shows here (issue 29, class 5).
//! - `P-initialize-altered`: the `agentInfo` of an `initialize` answer the client gets is
//!   one an agent wrote (the proxy decodes the agent's answer and writes it again; the
//!   agents name themselves with escapes, unicode and Windows paths ending in a
//!   backslash).
//! - `P-update-twice`: no update of an agent reaches the client twice on one connection.
//! - `P-update-before-open`: on a connection, no `session/update` and no agent's request
//!   reaches the client before it sent its `session/new` or `session/load` there (after a
//!   crash of the proxy, the restored turns' output and the last load's history are not
//!   the new connection's until it loads the session).
//! - `P-history-forwarded`: history an agent replays on a `session/load` reaches the
//!   client only while its own `session/load` is open, once per load: never the history
//!   of a recovery's load, never twice.
//! - `P-answer-misrouted`: an agent process receives answers only to requests it asked,
//!   each at most once, and a client's answer only for the request the client meant.
//! - `P-retired-request-shown`: no request an agent wrote after the proxy retired its
//!   process (asked it to go) reaches the client, nor one of an earlier incarnation's.
//! - `P-replay-once`: no prompt an agent receives carries more than one replay block.
//! - `P-replay-generation`: a re-prompt a live agent receives restates a later recovery
//!   generation than any re-prompt of the same text before it in the same proxy
//!   incarnation (nothing older, nothing twice).
//! - `P-replay-behind-client`: a re-prompt's replay block tells the agent to go on after
//!   at least the updates of its turn the client had already read when the agent got it
//!   (else the agent repeats output the client has).
//! - `P-replaced-unproven`: the client is told its conversation was replaced only when the
//!   answer to the load of the agent that made the new one is positive proof under rule
//!   6's independent reference (`palisade_reference::rule6`), as the engine world judges.
//! - `P-replaced-silently`: the conversation the client's prompts reach changes no more
//!   often than the client was told of a replacement.
//! - `P-forward-twice`, `P-forward-misrouted`, `P-forward-unfounded`: a session method the
//!   client sent (`session/set_mode`) reaches agents at most once, under a conversation
//!   the receiving agent created or loaded, and a success the client got for it was an
//!   agent's answer.
//! - `P-agent-unauthenticated`: once the client's `authenticate` was answered with
//!   success, no agent process refuses a request of the proxy as unauthenticated: the
//!   client's authentication reaches every process that serves it, recoveries' and
//!   restarted proxies' included (agents that authenticate per process,
//!   `[workload] auth_required`).
//! - `P-stray-forwarded`, `P-stray-answer`: a request naming a session the proxy never
//!   minted reaches no agent, and gets one answer, an error, at the latest when a later
//!   request of the client on the same connection is answered.
//! - `P-agent-outlives-proxy`: no agent process runs once its proxy exited.
//! - `P-no-exit` (liveness): the proxy exits once the client closed its end.

use std::collections::{BTreeMap, BTreeSet};

use palisade_engine::replay::REPLAY_BLOCK_TAG;
use palisade_wire::RequestId;

use super::super::env::EnvState;
use super::super::oracle::stale_replay;
use super::client::{ClientLog, Item};
use super::LOAD_REPLAY;
use crate::oracle::{replay_delivered_through, strip_blocks, CaughtBy, Violation};
use crate::world::oracle::rule6_allows;
use palisade_core::classify::AgentProfile;
use palisade_testkit::agent_model::LoadCapability;

fn v(invariant: &str, message: String, line: u64) -> Violation {
    let liveness = matches!(invariant, "P-no-exit" | "P-prompt-unanswered");
    Violation {
        invariant: invariant.into(),
        message,
        events: vec![line],
        by: if liveness {
            CaughtBy::Liveness
        } else {
            CaughtBy::GroundTruth
        },
    }
}

/// Judges a finished run: `exits` are the proxy's exits (incarnation, code, agents alive,
/// trace line); `finished` whether the last one ended the run.
pub(crate) fn judge(
    env: &EnvState,
    log: &ClientLog,
    prompts: usize,
    exits: &[(u32, u8, Vec<u32>, u64)],
    finished: bool,
    profile: AgentProfile,
    idx: u64,
) -> Result<(), Violation> {
    let Some(truth) = env.proxy.as_ref() else {
        return Ok(());
    };
    // Safety first: what reached whom.
    let mut got: BTreeMap<(u32, &RequestId), usize> = BTreeMap::new();
    for g in &truth.got {
        let ask = truth.asked.iter().find(|a| a.pid == g.pid && a.id == g.id);
        let count = got.entry((g.pid, &g.id)).or_insert(0);
        *count += 1;
        let wrong = match (ask, &g.answers) {
            (None, _) => Some(format!(
                "process {} received an answer to {:?}, a request it never made",
                g.pid, g.id
            )),
            (Some(_), _) if *count > 1 => Some(format!(
                "process {} received a second answer to its request {:?}",
                g.pid, g.id
            )),
            (Some(a), Some(meant)) if *meant != a.tool => Some(format!(
                "process {} received, for its request {:?} ({}), the client's answer to {meant}",
                g.pid, g.id, a.tool
            )),
            _ => None,
        };
        if let Some(message) = wrong {
            return Err(v(
                "P-answer-misrouted",
                format!("{message} at {} ms", g.at_ms),
                idx,
            ));
        }
    }
    for conn in &log.conns {
        let line = |i: usize| conn.lines.get(i).copied().unwrap_or(idx);
        let mut sent: BTreeMap<i64, (&'static str, usize)> = BTreeMap::new();
        let mut answers: BTreeSet<i64> = BTreeSet::new();
        let mut markers: BTreeSet<&str> = BTreeSet::new();
        // The open `session/load` and the history it got.
        let mut loading: Option<(i64, u32)> = None;
        // The client asked for its session on this connection (`session/new` or `load`).
        let mut opened = false;
        for (i, (_, item)) in conn.items.iter().enumerate() {
            if matches!(item, Item::Update { .. } | Item::Asked { .. }) && !opened {
                return Err(v(
                    "P-update-before-open",
                    format!(
                        "the client got a session/update or an agent's request on connection {} before it opened its session there",
                        conn.incarnation
                    ),
                    line(i),
                ));
            }
            match item {
                Item::Sent { id, method, .. } => {
                    sent.insert(*id, (method, i));
                    opened |= matches!(*method, "session/new" | "session/load");
                    if *method == "session/load" {
                        loading = Some((*id, 0));
                    }
                }
                Item::Answer { id, .. } => {
                    let RequestId::Number(n) = id else {
                        return Err(v(
                            "P-answered-twice",
                            format!("the client got an answer to {id:?}, which it never sent"),
                            line(i),
                        ));
                    };
                    if !sent.contains_key(n) {
                        return Err(v(
                            "P-answered-twice",
                            format!(
                                "the client got an answer to its request {n}, which it never sent"
                            ),
                            line(i),
                        ));
                    }
                    if !answers.insert(*n) {
                        return Err(v(
                            "P-answered-twice",
                            format!("the client's {} {n} was answered twice", sent[n].0),
                            line(i),
                        ));
                    }
                    if loading.is_some_and(|(id, _)| id == *n) {
                        loading = None;
                    }
                }
                Item::Update {
                    marker: Some(marker),
                    digest,
                    ..
                } if env
                    .written
                    .get(marker.as_str())
                    .is_some_and(|w| *digest != Some(w.digest())) =>
                {
                    return Err(v(
                        "P-update-altered",
                        format!(
                            "the update {marker} reached the client on connection {} altered from what its agent wrote",
                            conn.incarnation
                        ),
                        line(i),
                    ));
                }
                Item::Update {
                    marker: Some(marker),
                    ..
                } if !markers.insert(marker) => {
                    return Err(v(
                        "P-update-twice",
                        format!(
                            "the update {marker} reached the client twice on connection {}",
                            conn.incarnation
                        ),
                        line(i),
                    ));
                }
                Item::Update { history: true, .. } => match loading.as_mut() {
                    Some((_, n)) if *n < LOAD_REPLAY => *n += 1,
                    Some((id, _)) => {
                        return Err(v(
                            "P-history-forwarded",
                            format!("more history than one load replays reached the client during its session/load {id}"),
                            line(i),
                        ));
                    }
                    None => {
                        return Err(v(
                            "P-history-forwarded",
                            "history an agent replayed reached the client outside its own session/load".into(),
                            line(i),
                        ));
                    }
                },
                Item::Asked { tool, .. } => {
                    let Some(ask) = truth.asked.iter().find(|a| a.tool == *tool) else {
                        return Err(v(
                            "P-retired-request-shown",
                            format!("the client was shown a request ({tool}) no agent made"),
                            line(i),
                        ));
                    };
                    let incarnation = env.procs.get(&ask.pid).map(|p| p.incarnation);
                    if ask.after_retired || incarnation != Some(conn.incarnation) {
                        return Err(v(
                            "P-retired-request-shown",
                            format!(
                                "the client (connection {}) was shown the request {tool} of process {} (incarnation {incarnation:?}), written at {} ms{}",
                                conn.incarnation,
                                ask.pid,
                                ask.at_ms,
                                if ask.after_retired { " after the proxy asked it to go" } else { "" }
                            ),
                            line(i),
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    // What the agents wrote reaches the client as they wrote it: the proxy decodes an
    // agent's `initialize` answer (to advertise `loadSession`) and writes it again.
    for (conn, line, info) in &log.agent_infos {
        if !truth.agent_infos.contains(info) {
            return Err(v(
                "P-initialize-altered",
                format!(
                    "the client's initialize answer on connection {} names the agent {info}, which no agent wrote",
                    log.conns.get(*conn).map_or(0, |c| c.incarnation)
                ),
                *line,
            ));
        }
    }
    // Rule 6 on what the agents answered: the client is told of a replaced conversation
    // only when the agent's answer to the load was positive proof that it is gone, and
    // of every conversation replaced.
    let mut replaced = 0;
    for conn in &log.conns {
        for (i, (at, item)) in conn.items.iter().enumerate() {
            if !matches!(item, Item::Replaced) {
                continue;
            }
            replaced += 1;
            // The creation it announces: the last one by a process of this incarnation.
            let Some((pid, made_at, conversation)) =
                truth.created.iter().rfind(|(pid, made_at, _)| {
                    made_at <= at
                        && env
                            .procs
                            .get(pid)
                            .is_some_and(|p| p.incarnation == conn.incarnation)
                })
            else {
                continue;
            };
            let load = truth
                .loads
                .iter()
                .filter(|(p, loaded_at, _)| p == pid && loaded_at <= made_at)
                .map(|(_, _, load)| load)
                .next_back();
            let (capability, lists) = truth
                .caps
                .get(pid)
                .copied()
                .unwrap_or((LoadCapability::Absent, false));
            let requested = load.map_or("", |l| l.id.as_str());
            if let Err((existed, said)) = rule6_allows(profile, capability, lists, load, requested)
            {
                return Err(v(
                    "P-replaced-unproven",
                    format!(
                        "the client was told its conversation was replaced (by {conversation} of process {pid}), but the agent's answer proves nothing under rule 6 ({profile:?} profile): {said}; the agent {} {requested:?}",
                        if existed { "still had" } else { "no longer had" }
                    ),
                    conn.lines.get(i).copied().unwrap_or(idx),
                ));
            }
        }
    }
    let changes = truth.prompted.windows(2).filter(|w| w[0] != w[1]).count();
    if changes > replaced {
        return Err(v(
            "P-replaced-silently",
            format!(
                "the client's prompts reached agents in {} conversations one after another, and the client was told of {replaced} replacements",
                changes + 1
            ),
            idx,
        ));
    }
    // Rule 8 and 9 on what the agents read: a re-prompt carries one replay block, it
    // restates a later recovery generation than any re-prompt of the same text a live
    // agent of the same proxy incarnation received before it, and it tells the agent to go
    // on after at least the output the client already read.
    // Every send of the client is a text of its own: no two turns share one.
    if let Some((at_ms, generation, before)) = stale_replay(env, &[]) {
        return Err(v(
            "P-replay-generation",
            format!(
                "an agent re-prompted at {at_ms} ms was told it continues recovery generation {generation}, after a re-prompt of generation {before} reached an agent"
            ),
            idx,
        ));
    }
    for received in &env.prompts {
        let blocks = received.text.matches(REPLAY_BLOCK_TAG).count();
        if blocks > 1 {
            return Err(v(
                "P-replay-once",
                format!(
                    "an agent received, at {} ms, a prompt with {blocks} replay blocks",
                    received.at_ms
                ),
                idx,
            ));
        }
        let original = strip_blocks(&received.text);
        let Some(through) = replay_delivered_through(&received.text) else {
            continue;
        };
        if let Some(has) = client_has(log, env, original, received.at_ms) {
            if has > through {
                return Err(v(
                    "P-replay-behind-client",
                    format!(
                        "an agent re-prompted at {} ms was told the client has the turn's output through event {through}, but the client had read {has} of its updates",
                        received.at_ms
                    ),
                    idx,
                ));
            }
        }
    }
    // The prompts answered `end_turn`: their completing prompt's updates, once, in order.
    for send in &log.sends {
        let conn = &log.conns[send.conn];
        let answer = conn.items.iter().position(|(_, item)| {
            matches!(item, Item::Answer { id: RequestId::Number(n), ok: Some(stop) } if *n == send.id && stop == "end_turn")
        });
        let Some(answer) = answer else { continue };
        let answer_line = conn.lines.get(answer).copied().unwrap_or(idx);
        let tags: Vec<&str> = truth
            .prompts
            .iter()
            .filter(|(_, _, text)| strip_blocks(text) == send.text)
            .map(|(_, tag, _)| tag.as_str())
            .filter(|tag| {
                truth
                    .answers
                    .get(*tag)
                    .is_some_and(|a| a.as_deref() == Some("end_turn"))
            })
            .collect();
        if tags.is_empty() {
            return Err(v(
                "P-stop-unfounded",
                format!(
                    "the client's prompt {:?} was answered end_turn, and no agent that received it answered so",
                    send.text
                ),
                answer_line,
            ));
        }
        let positions: BTreeMap<&str, Vec<usize>> = {
            let mut m: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
            for (i, (_, item)) in conn.items.iter().enumerate() {
                if let Item::Update {
                    marker: Some(marker),
                    ..
                } = item
                {
                    m.entry(marker.as_str()).or_default().push(i);
                }
            }
            m
        };
        let delivered = |tag: &str| -> Result<(), String> {
            let mut last = None;
            for marker in truth.events.get(tag).into_iter().flatten() {
                match positions.get(marker.as_str()).map(Vec::as_slice) {
                    Some([at]) if *at < answer && last.is_none_or(|l| l < *at) => last = Some(*at),
                    Some([at]) if *at > answer => {
                        return Err(format!("{marker} reached the client after the answer"))
                    }
                    Some([_]) => return Err(format!("{marker} reached the client out of order")),
                    Some(_) => return Err(format!("{marker} reached the client twice")),
                    None => return Err(format!("{marker} never reached the client")),
                }
            }
            Ok(())
        };
        let verdicts: Vec<Result<(), String>> = tags.iter().map(|t| delivered(t)).collect();
        if let Some(Err(why)) = verdicts
            .iter()
            .find(|_| verdicts.iter().all(Result::is_err))
        {
            return Err(v(
                "P-update-lost",
                format!(
                    "the client's prompt {:?} was answered end_turn, but of the updates of the agent's prompt {} that completed it, {why}",
                    send.text,
                    tags.last().copied().unwrap_or_default()
                ),
                answer_line,
            ));
        }
    }
    forwarded(truth, log, idx)?;
    authenticated(truth, log, idx)?;
    strays(truth, log, idx)?;
    for (incarnation, code, alive, line) in exits {
        if !alive.is_empty() {
            return Err(v(
                "P-agent-outlives-proxy",
                format!("incarnation {incarnation} exited ({code}) with agent processes {alive:?} still running"),
                *line,
            ));
        }
    }
    let last = |log: &ClientLog| {
        log.conns
            .last()
            .and_then(|c| c.lines.last().copied())
            .unwrap_or(idx)
    };
    if log.unfinished(prompts) {
        let missing: Vec<usize> = (0..prompts)
            .filter(|k| !log.answered.contains_key(k))
            .map(|k| k + 1)
            .collect();
        return Err(v(
            "P-prompt-unanswered",
            format!("prompts {missing:?} never got an answer on any connection"),
            last(log),
        ));
    }
    if !finished {
        return Err(v(
            "P-no-exit",
            "the client closed its end and the proxy never exited".into(),
            last(log),
        ));
    }
    Ok(())
}

/// The session methods the proxy forwards (`session/set_mode`), judged from what the client
/// sent and got and what the agents received:
/// - `P-forward-twice`: each request reaches agents at most once (not again after a
///   recovery, not to two runtimes);
/// - `P-forward-misrouted`: it reaches an agent under a conversation that agent created or
///   loaded (the proxy's session id is the client's, never the agent's);
/// - `P-forward-unfounded`: a success the client got was an agent's answer: the request
///   reached an agent.
fn forwarded(
    truth: &super::super::env::ProxyTruth,
    log: &ClientLog,
    idx: u64,
) -> Result<(), Violation> {
    let mut reached: BTreeMap<&str, usize> = BTreeMap::new();
    for (pid, conversation, mode) in &truth.modes {
        let count = reached.entry(mode.as_str()).or_default();
        *count += 1;
        if *count > 1 {
            return Err(v(
                "P-forward-twice",
                format!("the client's session/set_mode {mode} reached agents {count} times (the last, process {pid})"),
                idx,
            ));
        }
        let own = truth
            .created
            .iter()
            .any(|(p, _, c)| p == pid && c == conversation)
            || truth.loads.iter().any(|(p, _, l)| {
                p == pid && l.id == *conversation && matches!(l.answer, Some(Ok(())))
            });
        if !own {
            return Err(v(
                "P-forward-misrouted",
                format!("process {pid} received the client's session/set_mode {mode} for conversation {conversation:?}, which it never created or loaded"),
                idx,
            ));
        }
    }
    for (conn, id, mode) in &log.modes {
        let Some(c) = log.conns.get(*conn) else {
            continue;
        };
        let succeeded = c.items.iter().enumerate().find(|(_, (_, item))| {
            matches!(item, Item::Answer { id: RequestId::Number(n), ok: Some(_) } if n == id)
        });
        if let Some((i, _)) = succeeded {
            if !reached.contains_key(mode.as_str()) {
                return Err(v(
                    "P-forward-unfounded",
                    format!("the client's session/set_mode {mode} (request {id} on connection {conn}) was answered with success, but no agent received it"),
                    c.lines.get(i).copied().unwrap_or(idx),
                ));
            }
        }
    }
    Ok(())
}

/// `P-agent-unauthenticated`: after the client's first successful `authenticate`, no
/// agent refuses one of the proxy's requests as unauthenticated.
fn authenticated(
    truth: &super::super::env::ProxyTruth,
    log: &ClientLog,
    idx: u64,
) -> Result<(), Violation> {
    let Some(since) = log
        .auths
        .iter()
        .filter_map(|a| a.answer.filter(|(_, ok)| *ok).map(|(at, _)| at))
        .min()
    else {
        return Ok(());
    };
    if let Some((pid, at, method)) = truth.unauthenticated.iter().find(|(_, at, _)| *at >= since) {
        return Err(v(
            "P-agent-unauthenticated",
            format!("process {pid} refused the proxy's {method} at {at} ms as unauthenticated, although the client authenticated at {since} ms"),
            idx,
        ));
    }
    Ok(())
}

/// `P-stray-forwarded` and `P-stray-answer`: a request naming a session the proxy never
/// minted (its text, or the mode it asks for, is its unique tag) reaches no agent, and is
/// answered once, with an error, no later than the client's next request on its
/// connection.
fn strays(
    truth: &super::super::env::ProxyTruth,
    log: &ClientLog,
    idx: u64,
) -> Result<(), Violation> {
    for stray in &log.strays {
        let reached = truth
            .prompts
            .iter()
            .map(|(pid, _, text)| (pid, text))
            .chain(truth.modes.iter().map(|(pid, _, mode)| (pid, mode)))
            .find(|(_, text)| text.contains(stray.tag.as_str()));
        if let Some((pid, _)) = reached {
            return Err(v(
                "P-stray-forwarded",
                format!(
                    "the client's {} naming the unknown session {} reached process {pid}",
                    stray.method, stray.tag
                ),
                idx,
            ));
        }
        let line = log
            .conns
            .get(stray.conn)
            .and_then(|c| c.lines.last().copied())
            .unwrap_or(idx);
        match stray.answers.as_slice() {
            [Err(_)] => {}
            [] => {
                // Unanswered: fine only if nothing the client asked after it on that
                // connection was answered either (the proxy went away first).
                let later_answered = log.conns.get(stray.conn).is_some_and(|c| {
                    c.items.iter().any(|(_, item)| {
                        matches!(item, Item::Answer { id: RequestId::Number(n), .. } if *n > stray.id)
                    })
                });
                if later_answered {
                    return Err(v(
                        "P-stray-answer",
                        format!(
                            "the client's {} naming the unknown session {} (request {} on connection {}) was never answered, though later requests were",
                            stray.method, stray.tag, stray.id, stray.conn
                        ),
                        line,
                    ));
                }
            }
            answers => {
                return Err(v(
                    "P-stray-answer",
                    format!(
                        "the client's {} naming the unknown session {} (request {} on connection {}) was answered {answers:?}: one error was due",
                        stray.method, stray.tag, stray.id, stray.conn
                    ),
                    line,
                ));
            }
        }
    }
    Ok(())
}

/// How many of the updates of the client's prompt `text` the client had read before
/// `at_ms`, counted on the connection of its last send of that text before then, from that
/// send on (a proxy restarted since may know of more, from the connection before: not
/// counted, so this is a lower bound); `None` if the client had not sent it then.
fn client_has(log: &ClientLog, env: &EnvState, text: &str, at_ms: u64) -> Option<u64> {
    let truth = env.proxy.as_ref()?;
    let tags: BTreeSet<&str> = truth
        .prompts
        .iter()
        .filter(|(_, _, t)| strip_blocks(t) == text)
        .map(|(_, tag, _)| tag.as_str())
        .collect();
    let (conn, from) = log
        .sends
        .iter()
        .filter(|send| send.text == text)
        .filter_map(|send| {
            let conn = log.conns.get(send.conn)?;
            let at = conn.items.iter().position(|(t, item)| {
                *t < at_ms && matches!(item, Item::Sent { id, method: "session/prompt", .. } if *id == send.id)
            })?;
            Some((conn, at))
        })
        .max_by_key(|(conn, at)| (conn.incarnation, conn.items[*at].0))?;
    let read: BTreeSet<&str> = conn.items[from..]
        .iter()
        .take_while(|(t, _)| *t < at_ms)
        .filter_map(|(_, item)| match item {
            Item::Update {
                marker: Some(marker),
                history: false,
                ..
            } => Some(marker.as_str()),
            _ => None,
        })
        .filter(|marker| {
            marker
                .rsplit_once('#')
                .is_some_and(|(tag, _)| tags.contains(tag))
        })
        .collect();
    Some(read.len() as u64)
}

#[cfg(test)]
mod tests {
    //! The checker fed recorded histories: each check fails on a history that breaks it
    //! and holds on the same history without the break.

    use palisade_wire::RequestId;

    use super::super::super::env::{AgentAsk, AgentGot, EnvState, ProcTruth, ProxyTruth};
    use super::super::client::{ClientLog, Conn, Item, PromptSend};
    use super::*;

    /// One connection (incarnation 1): initialize, session/new, then the agent 1001's
    /// permission request shown as id 1 and answered; process 1001 got the answer.
    fn history() -> (EnvState, ClientLog) {
        let mut env = EnvState::default();
        env.procs.insert(
            1001,
            ProcTruth {
                incarnation: 1,
                alive: false,
                guarded: true,
                died_at_ms: Some(900),
                died_with_supervisor: false,
                asked_at_ms: Some(800),
                died_unasked: false,
                agent: None,
            },
        );
        let mut truth = ProxyTruth::default();
        truth.asked.push(AgentAsk {
            pid: 1001,
            id: RequestId::Number(1_000_001),
            tool: "p1001.1-perm".into(),
            at_ms: 50,
            after_retired: false,
        });
        truth.got.push(AgentGot {
            pid: 1001,
            id: RequestId::Number(1_000_001),
            answers: Some("p1001.1-perm".into()),
            at_ms: 60,
        });
        env.proxy = Some(truth);
        let items = vec![
            (
                0,
                Item::Sent {
                    id: 1,
                    method: "initialize",
                    send: None,
                },
            ),
            (
                1,
                Item::Answer {
                    id: RequestId::Number(1),
                    ok: Some(String::new()),
                },
            ),
            (
                1,
                Item::Sent {
                    id: 2,
                    method: "session/new",
                    send: None,
                },
            ),
            (
                5,
                Item::Answer {
                    id: RequestId::Number(2),
                    ok: Some(String::new()),
                },
            ),
            (
                50,
                Item::Asked {
                    id: 1,
                    tool: "p1001.1-perm".into(),
                },
            ),
            (
                55,
                Item::Answered {
                    id: 1,
                    tool: "p1001.1-perm".into(),
                },
            ),
        ];
        let lines = (0..items.len() as u64).collect();
        let log = ClientLog {
            conns: vec![Conn {
                incarnation: 1,
                items,
                lines,
            }],
            ..ClientLog::default()
        };
        (env, log)
    }

    fn caught(env: &EnvState, log: &ClientLog) -> Option<String> {
        judge(env, log, 0, &[], true, AgentProfile::Generic, 99)
            .err()
            .map(|v| v.invariant)
    }

    /// A `session/set_mode` the client sent (request 3, answered with success) reaches
    /// process 1001 once, under the conversation it created: the forward checks hold; each
    /// break of them is caught.
    #[test]
    fn a_forwarded_session_method_reaches_one_agent_under_its_conversation() {
        // `change` breaks the agents' receipts of the history, or leaves them.
        let run = |change: &dyn Fn(&mut ProxyTruth)| {
            let (mut env, mut log) = history();
            let conn = &mut log.conns[0];
            conn.items.push((
                60,
                Item::Sent {
                    id: 3,
                    method: "session/set_mode",
                    send: None,
                },
            ));
            conn.items.push((
                70,
                Item::Answer {
                    id: RequestId::Number(3),
                    ok: Some(String::new()),
                },
            ));
            conn.lines.extend([6, 7]);
            log.modes.push((0, 3, "mode-0".into()));
            let truth = env.proxy.as_mut().expect("a proxy run");
            truth.created.push((1001, 4, "sess-1".into()));
            truth.modes.push((1001, "sess-1".into(), "mode-0".into()));
            change(truth);
            caught(&env, &log)
        };
        assert_eq!(run(&|_| {}), None);
        assert_eq!(
            run(&|t| t.modes.push((1002, "sess-1".into(), "mode-0".into()))).as_deref(),
            Some("P-forward-twice")
        );
        assert_eq!(
            run(&|t| t.modes[0].1 = "pls_sim1_1".into()).as_deref(),
            Some("P-forward-misrouted")
        );
        assert_eq!(
            run(&|t| t.modes.clear()).as_deref(),
            Some("P-forward-unfounded")
        );
    }

    /// The client authenticated at 10 ms: a refusal as unauthenticated before then holds,
    /// one after is `P-agent-unauthenticated`.
    #[test]
    fn once_the_client_authenticated_no_agent_refuses_the_proxy() {
        use super::super::client::Auth;
        let run = |refused_at: Option<u64>| {
            let (mut env, mut log) = history();
            log.auths.push(Auth {
                conn: 0,
                id: 9,
                answer: Some((10, true)),
            });
            let truth = env.proxy.as_mut().expect("a proxy run");
            truth.authenticated.push((1001, 9, true));
            if let Some(at) = refused_at {
                truth
                    .unauthenticated
                    .push((1002, at, "session/load".into()));
            }
            caught(&env, &log)
        };
        assert_eq!(run(None), None);
        assert_eq!(run(Some(5)), None);
        assert_eq!(run(Some(10)).as_deref(), Some("P-agent-unauthenticated"));
    }

    /// A `session/prompt` naming an unknown session (request 3) answered with one error
    /// and reaching no agent holds; reaching an agent, answered with success, twice, or
    /// never though a later request was answered, is caught.
    #[test]
    fn a_request_for_an_unknown_session_reaches_no_agent_and_gets_one_error() {
        use super::super::client::Stray;
        let run = |answers: Vec<Result<(), i64>>, later: bool, reached: bool| {
            let (mut env, mut log) = history();
            log.strays.push(Stray {
                conn: 0,
                id: 3,
                method: "session/prompt",
                tag: "stray-0-c0!".into(),
                answers,
            });
            if later {
                let conn = &mut log.conns[0];
                conn.items.push((
                    65,
                    Item::Sent {
                        id: 4,
                        method: "session/set_mode",
                        send: None,
                    },
                ));
                conn.items.push((
                    70,
                    Item::Answer {
                        id: RequestId::Number(4),
                        ok: Some(String::new()),
                    },
                ));
                conn.lines.extend([6, 7]);
            }
            if reached {
                let truth = env.proxy.as_mut().expect("a proxy run");
                truth
                    .prompts
                    .push((1001, "p1001.2".into(), "stray-0-c0!".into()));
            }
            caught(&env, &log)
        };
        assert_eq!(run(vec![Err(-32002)], true, false), None);
        assert_eq!(run(vec![], false, false), None, "the proxy went away first");
        assert_eq!(
            run(vec![Err(-32002)], true, true).as_deref(),
            Some("P-stray-forwarded")
        );
        assert_eq!(
            run(vec![Ok(())], true, false).as_deref(),
            Some("P-stray-answer")
        );
        assert_eq!(
            run(vec![Err(-32002), Err(-32002)], true, false).as_deref(),
            Some("P-stray-answer")
        );
        assert_eq!(run(vec![], true, false).as_deref(), Some("P-stray-answer"));
    }

    /// The client's `initialize` answer names the agent as an agent wrote it (a Windows
    /// path ending in a backslash, unicode); a name altered on its way is
    /// `P-initialize-altered`.
    #[test]
    fn an_agent_info_altered_on_its_way_is_caught() {
        let info = serde_json::json!({"name": "p1 café 😀", "title": "C:\\Users\\dev\\", "version": "0.23.1"});
        let (mut env, mut log) = history();
        env.proxy
            .as_mut()
            .expect("the proxy's truth")
            .agent_infos
            .push(info.clone());
        log.agent_infos.push((0, 1, info.clone()));
        assert_eq!(caught(&env, &log), None);
        let mut altered = info;
        altered["title"] = serde_json::json!("C:\\Users\\dev\"");
        log.agent_infos.push((0, 1, altered));
        assert_eq!(caught(&env, &log).as_deref(), Some("P-initialize-altered"));
    }

    /// An update the client decodes to other text than its agent wrote (cut at an escaped
    /// backslash) is `P-update-altered`; the text as written holds.
    #[test]
    fn an_update_altered_on_its_way_is_caught() {
        use palisade_testkit::agent_model::{EventText, StreamedEvent};
        use palisade_testkit::wire_text;

        let text = "p1001.1#1 xx C:\\Users\\";
        let with_update = |decoded: &str| {
            let (mut env, mut log) = history();
            env.written.insert(
                "p1001.1#1".into(),
                StreamedEvent {
                    marker: "p1001.1#1".into(),
                    index: 1,
                    wire_bytes: 100,
                    tool_call: false,
                    raw_crc: 0,
                    text: EventText::Plain(text.into()),
                    args: None,
                },
            );
            log.conns[0].items.push((
                70,
                Item::Update {
                    marker: Some("p1001.1#1".into()),
                    history: false,
                    digest: Some(wire_text::content_digest(decoded, None)),
                },
            ));
            log.conns[0].lines.push(6);
            caught(&env, &log)
        };
        assert_eq!(with_update(text), None);
        assert_eq!(
            with_update("p1001.1#1 xx C:\\Users\"}").as_deref(),
            Some("P-update-altered")
        );
    }

    #[test]
    fn the_history_holds_and_each_break_is_caught() {
        let (env, log) = history();
        assert_eq!(caught(&env, &log), None);

        // The request was written after the proxy asked the process to go.
        let (mut env2, log2) = history();
        env2.proxy.as_mut().expect("set").asked[0].after_retired = true;
        assert_eq!(
            caught(&env2, &log2).as_deref(),
            Some("P-retired-request-shown")
        );

        // The process got a second answer, or the answer to another request.
        let (mut env3, log3) = history();
        let again = env3.proxy.as_ref().expect("set").got[0].clone();
        env3.proxy.as_mut().expect("set").got.push(again);
        assert_eq!(caught(&env3, &log3).as_deref(), Some("P-answer-misrouted"));
        let (mut env4, log4) = history();
        env4.proxy.as_mut().expect("set").got[0].answers = Some("p1001.2-perm".into());
        assert_eq!(caught(&env4, &log4).as_deref(), Some("P-answer-misrouted"));

        // The client's request answered twice.
        let (env5, mut log5) = history();
        let answer = log5.conns[0].items[3].clone();
        log5.conns[0].items.push(answer);
        log5.conns[0].lines.push(6);
        assert_eq!(caught(&env5, &log5).as_deref(), Some("P-answered-twice"));

        // History outside the client's own session/load, and an update before it opened.
        let (env6, mut log6) = history();
        log6.conns[0].items.push((
            70,
            Item::Update {
                marker: None,
                history: true,
                digest: None,
            },
        ));
        log6.conns[0].lines.push(6);
        assert_eq!(caught(&env6, &log6).as_deref(), Some("P-history-forwarded"));
        let (env7, mut log7) = history();
        log7.conns[0].items.insert(
            1,
            (
                0,
                Item::Update {
                    marker: Some("p1001.1#1".into()),
                    history: false,
                    digest: None,
                },
            ),
        );
        log7.conns[0].lines.push(6);
        assert_eq!(
            caught(&env7, &log7).as_deref(),
            Some("P-update-before-open")
        );
    }

    /// A prompt re-sent to a new agent: its replay block says how much of the turn's
    /// output the client has. The client read two updates of the first agent's prompt.
    fn replayed(blocks: u8, through: u64) -> (EnvState, ClientLog) {
        let (mut env, mut log) = history();
        let text = "p1";
        let again = palisade_engine::replay::render_prompt(
            text,
            &palisade_core::PromptRequest {
                replay_blocks: blocks,
                replay_generation: 2,
                delivered_through: through,
            },
        );
        let truth = env.proxy.as_mut().expect("set");
        truth.prompts.push((1001, "1001.1".into(), text.into()));
        truth.prompts.push((1002, "1002.1".into(), again.clone()));
        env.prompts.push(super::super::super::env::Received {
            pid: 1001,
            tag: "p1001.1".into(),
            at_ms: 10,
            text: text.into(),
        });
        env.prompts.push(super::super::super::env::Received {
            pid: 1002,
            tag: "p1002.1".into(),
            at_ms: 40,
            text: again,
        });
        let conn = &mut log.conns[0];
        conn.items.insert(
            4,
            (
                6,
                Item::Sent {
                    id: 3,
                    method: "session/prompt",
                    send: Some(0),
                },
            ),
        );
        for (at, k) in [(20, 0), (21, 1)] {
            conn.items.insert(
                5 + k,
                (
                    at,
                    Item::Update {
                        marker: Some(format!("1001.1#{k}")),
                        history: false,
                        digest: None,
                    },
                ),
            );
        }
        conn.lines = (0..conn.items.len() as u64).collect();
        log.sends.push(PromptSend {
            k: 0,
            text: text.into(),
            conn: 0,
            id: 3,
        });
        (env, log)
    }

    #[test]
    fn a_replay_block_says_once_what_the_client_has() {
        let (env, log) = replayed(1, 2);
        assert_eq!(caught(&env, &log), None);
        let (env, log) = replayed(2, 2);
        assert_eq!(caught(&env, &log).as_deref(), Some("P-replay-once"));
        let (env, log) = replayed(1, 1);
        assert_eq!(
            caught(&env, &log).as_deref(),
            Some("P-replay-behind-client")
        );
    }

    #[test]
    fn a_conversation_is_replaced_only_on_proof_and_never_silently() {
        use crate::world::oracle::LoadTruth;
        // Process 1001 had its load of sess-1 fail, created sess-2, and the client's next
        // prompt went there.
        let replaced = |answer: Result<(), palisade_wire::RpcError>, told: bool| {
            let (mut env, mut log) = history();
            let truth = env.proxy.as_mut().expect("set");
            truth.caps.insert(1001, (LoadCapability::True, false));
            truth.prompted = vec!["sess-1".into(), "sess-2".into()];
            truth.loads.push((
                1001,
                20,
                LoadTruth {
                    id: "sess-1".into(),
                    existed: answer.is_ok(),
                    answer: Some(answer),
                },
            ));
            truth.created.push((1001, 21, "sess-2".into()));
            if told {
                log.conns[0].items.push((30, Item::Replaced));
                log.conns[0].lines.push(6);
            }
            caught(&env, &log)
        };
        let gone = palisade_wire::RpcError {
            code: -32002,
            message: "Resource not found: sess-1".into(),
            data: None,
        };
        assert_eq!(replaced(Err(gone.clone()), true), None);
        assert_eq!(
            replaced(Err(gone), false).as_deref(),
            Some("P-replaced-silently")
        );
        let busy = palisade_wire::RpcError {
            code: -32603,
            message: "Internal error".into(),
            data: None,
        };
        assert_eq!(
            replaced(Err(busy), true).as_deref(),
            Some("P-replaced-unproven")
        );
    }
}
