//! The simulated ACP client of `palisade-proxy`: what an editor does on the proxy's stdin
//! and stdout, one connection per proxy incarnation.
//!
//! It writes `initialize`, then `session/new` (or, once it has a session id, `session/load`
//! of it: after a proxy crash-restart it reconnects to its session), then its prompts one
//! at a time (`prompt-<k> c<connection>`, so every send is told apart), each maybe followed
//! by a `session/cancel` and, in scenarios that ask for it, preceded by a `session/set_mode`
//! it does not wait for. The agents' `session/request_permission` requests it answers
//! (each answer names the request it means in `_meta.answers`) promptly, late, never,
//! twice, with the error of a refusal, or under the id of another request. A prompt it
//! never got an answer for is sent again on the next connection. When every prompt is
//! answered and its late answers are written, it closes its end (stdin EOF).
//!
//! Everything it writes and reads is recorded in [`ClientLog`], the ground truth the proxy
//! oracle judges from, and noted in the trace.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use palisade_testkit::wire_text;
use palisade_wire::jsonrpc::{encode_message, encode_response, parse_frame, Frame};
use palisade_wire::{RawJson, RequestId, RpcError};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};

use super::super::env::now_ms;
use crate::logbook::{lock as lock_logbook, Logbook};
use crate::mix::{chance, mix, pick};

/// How the client answers one permission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answering {
    Promptly,
    Late,
    Never,
    Twice,
    Refused,
    /// Under the id of another request (or one never sent).
    WrongId,
}

impl Answering {
    fn name(self) -> &'static str {
        match self {
            Answering::Promptly => "promptly",
            Answering::Late => "late",
            Answering::Never => "never",
            Answering::Twice => "twice",
            Answering::Refused => "refused",
            Answering::WrongId => "wrong_id",
        }
    }
}

/// One thing the client read or wrote, on one connection.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Item {
    /// It sent a request: its id, its method, and the prompt send it is (for prompts).
    Sent {
        id: i64,
        method: &'static str,
        send: Option<usize>,
    },
    /// An answer to one of its requests: `Some(stopReason or "")` for a result, `None`
    /// for an error.
    Answer { id: RequestId, ok: Option<String> },
    /// A `session/update`: a marker of an agent's event (`<tag>#<k>`), a history line
    /// (`history <i>`), or something else.
    Update {
        marker: Option<String>,
        history: bool,
        /// The content the client decoded ([`wire_text::update_digest`]).
        digest: Option<u64>,
    },
    /// A request of an agent, under the proxy's id, with its `toolCallId`.
    Asked { id: i64, tool: String },
    /// It answered a request (under `id`), meaning the one with `tool`.
    Answered { id: i64, tool: String },
    /// `_palisade/conversation_replaced`.
    Replaced,
}

/// One connection: the items in order, each with its time and trace line.
#[derive(Debug, Default)]
pub(crate) struct Conn {
    pub(crate) incarnation: u32,
    pub(crate) items: Vec<(u64, Item)>,
    pub(crate) lines: Vec<u64>,
}

/// One prompt the client sent.
#[derive(Debug, Clone)]
pub(crate) struct PromptSend {
    /// Which of the workload's prompts (0-based).
    pub(crate) k: usize,
    pub(crate) text: String,
    pub(crate) conn: usize,
    pub(crate) id: i64,
}

/// What the client did and got, over every connection.
#[derive(Debug, Default)]
pub(crate) struct ClientLog {
    /// The proxy's session id, once `session/new` answered.
    pub(crate) label: Option<String>,
    pub(crate) conns: Vec<Conn>,
    pub(crate) sends: Vec<PromptSend>,
    /// Per workload prompt, the send that got an answer (the first).
    pub(crate) answered: BTreeMap<usize, usize>,
    /// The client closed its end: everything answered.
    pub(crate) done: bool,
    /// The client reads nothing before this (simulated ms).
    pub(crate) stall_until: u64,
    /// The `agentInfo` of each `initialize` answer the client got: connection, trace
    /// line, the value as the client decoded it.
    pub(crate) agent_infos: Vec<(usize, u64, Value)>,
    /// The `session/set_mode`s it sent: connection, request id, the mode (unique).
    pub(crate) modes: Vec<(usize, i64, String)>,
    /// The `authenticate`s it sent (one per connection whose `initialize` answer offered
    /// an auth method).
    pub(crate) auths: Vec<Auth>,
    /// The requests it sent naming a session the proxy never minted.
    pub(crate) strays: Vec<Stray>,
}

/// One `authenticate` the client sent.
#[derive(Debug, Clone)]
pub(crate) struct Auth {
    pub(crate) conn: usize,
    pub(crate) id: i64,
    /// When the answer came (simulated ms) and whether it was a success.
    pub(crate) answer: Option<(u64, bool)>,
}

/// One request naming a session the proxy never minted.
#[derive(Debug, Clone)]
pub(crate) struct Stray {
    pub(crate) conn: usize,
    pub(crate) id: i64,
    pub(crate) method: &'static str,
    /// The unknown session id, also the prompt's text or the mode it asks for (unique).
    pub(crate) tag: String,
    /// Its answers: `Ok` for a result, `Err(code)` for an error (more than one: answered
    /// twice).
    pub(crate) answers: Vec<Result<(), i64>>,
}

pub(crate) fn lock(log: &Mutex<ClientLog>) -> MutexGuard<'_, ClientLog> {
    log.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ClientLog {
    /// Whether some prompt is still unanswered.
    pub(crate) fn unfinished(&self, prompts: usize) -> bool {
        self.answered.len() < prompts
    }
}

/// Everything a connection of the client runs with.
pub(crate) struct Ctx {
    pub(crate) seed: u64,
    pub(crate) incarnation: u32,
    pub(crate) prompts: usize,
    pub(crate) think: (u64, u64),
    /// The chance of a `session/set_mode` before each prompt.
    pub(crate) set_mode: f64,
    /// The chance of a request naming an unknown session before each prompt.
    pub(crate) stray: f64,
    /// An `initialize` answered with an error is sent again (else the client goes on).
    pub(crate) reinitialize: bool,
    pub(crate) log: Arc<Mutex<ClientLog>>,
    pub(crate) logbook: Arc<Mutex<Logbook>>,
    pub(crate) start: Duration,
}

/// What the client waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Initializing(i64),
    Authenticating {
        id: i64,
        method: String,
        tries: u32,
    },
    Opening {
        id: i64,
        load: bool,
        tries: u32,
    },
    /// Waiting to send the next prompt.
    Idle,
    Prompting {
        id: i64,
        send: usize,
    },
    Done,
}

/// Opening tries before the client gives up on a connection's session (and waits for the
/// proxy's next incarnation).
const OPEN_TRIES: u32 = 20;
/// A late permission answer comes this many ms after the request, at most.
const LATE_MS: u64 = 3_000;

struct Client {
    ctx: Ctx,
    conn: usize,
    next_id: i64,
    phase: Phase,
    /// Writes due at a time: (at, seq) → line, and what it is.
    due: BTreeMap<(u64, u64), (String, Option<Item>)>,
    seq: u64,
    /// Permission requests asked on this connection: proxy id → tool.
    asked: BTreeMap<i64, String>,
    /// The pending cancel of the prompt in flight (its key in `due`).
    cancel: Option<(u64, u64)>,
}

/// Runs one connection of the client over the proxy's stdin (`to_proxy`) and stdout
/// (`from_proxy`), until the proxy's stdout closes.
pub(crate) async fn run(ctx: Ctx, to_proxy: DuplexStream, from_proxy: DuplexStream) {
    let conn = {
        let mut log = lock(&ctx.log);
        log.conns.push(Conn {
            incarnation: ctx.incarnation,
            ..Conn::default()
        });
        log.conns.len() - 1
    };
    let mut client = Client {
        ctx,
        conn,
        next_id: 1,
        phase: Phase::Idle,
        due: BTreeMap::new(),
        seq: 0,
        asked: BTreeMap::new(),
        cancel: None,
    };
    let mut writer = Some(to_proxy);
    let mut lines = BufReader::new(from_proxy).lines();
    let id = client.request(0, "initialize", hello(), None);
    client.phase = Phase::Initializing(id);
    loop {
        let now = client.now();
        while let Some((&key, _)) = client.due.iter().next().filter(|(k, _)| k.0 <= now) {
            let (line, item) = client.due.remove(&key).expect("just seen");
            if client.cancel == Some(key) {
                client.cancel = None;
            }
            let Some(w) = writer.as_mut() else { break };
            if w.write_all(line.as_bytes()).await.is_err() || w.flush().await.is_err() {
                // The proxy is gone.
                return;
            }
            if let Some(item) = item {
                client.record(item);
            }
        }
        if client.phase == Phase::Done && client.due.is_empty() && writer.is_some() {
            // Everything answered, every late answer written: stdin EOF.
            writer = None;
            lock(&client.ctx.log).done = true;
            client.note("closed", &[]);
        }
        let wake = client.due.keys().next().map(|k| k.0);
        let nap = wake.map(|w| madsim::time::sleep(Duration::from_millis(w.saturating_sub(now))));
        tokio::select! {
            biased;
            line = lines.next_line() => match line {
                Ok(Some(line)) => {
                    let stall = lock(&client.ctx.log).stall_until;
                    let now = client.now();
                    if stall > now {
                        madsim::time::sleep(Duration::from_millis(stall - now)).await;
                    }
                    client.read(&line);
                }
                // The proxy's stdout closed: this connection is over.
                _ => return,
            },
            () = async { nap.expect("guarded").await }, if nap.is_some() => {}
        }
    }
}

impl Client {
    fn now(&self) -> u64 {
        now_ms(self.ctx.start)
    }

    fn key(&self, a: u64, b: u64) -> u64 {
        mix(
            self.ctx.seed,
            u64::from(self.ctx.incarnation),
            a,
            b ^ 0x09c1_1e47,
        )
    }

    fn note(&self, what: &str, fields: &[(&'static str, u64)]) -> u64 {
        let now = self.now();
        let mut all = vec![("conn", self.conn as u64)];
        all.extend_from_slice(fields);
        lock_logbook(&self.ctx.logbook)
            .tracer
            .note(now, "client", what, &all)
    }

    fn record(&mut self, item: Item) {
        let (what, fields): (&str, Vec<(&'static str, u64)>) = match &item {
            Item::Sent { id, .. } => ("sent", vec![("id", *id as u64)]),
            Item::Answer { id, ok } => (
                "answer",
                vec![
                    (
                        "id",
                        match id {
                            RequestId::Number(n) => *n as u64,
                            _ => u64::MAX,
                        },
                    ),
                    ("ok", u64::from(ok.is_some())),
                ],
            ),
            Item::Update { history, .. } => ("update", vec![("history", u64::from(*history))]),
            Item::Asked { id, .. } => ("asked", vec![("id", *id as u64)]),
            Item::Answered { id, .. } => ("answered", vec![("id", *id as u64)]),
            Item::Replaced => ("replaced", vec![]),
        };
        let line = self.note(what, &fields);
        let now = self.now();
        let mut log = lock(&self.ctx.log);
        let conn = &mut log.conns[self.conn];
        conn.items.push((now, item));
        conn.lines.push(line);
    }

    fn write_at(&mut self, at: u64, line: String, item: Option<Item>) -> (u64, u64) {
        self.seq += 1;
        let key = (at, self.seq);
        self.due.insert(key, (line, item));
        key
    }

    /// Sends a request at `at` (ms from now); its id.
    fn request(
        &mut self,
        after: u64,
        method: &'static str,
        params: Value,
        send: Option<usize>,
    ) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        let line = encode_message(Some(&RequestId::Number(id)), method, Some(&params));
        let at = self.now() + after;
        self.write_at(at, line, Some(Item::Sent { id, method, send }));
        id
    }

    fn read(&mut self, line: &str) {
        match parse_frame(line.as_bytes()) {
            Ok(Frame::Response { id, outcome }) => {
                // An `initialize` answer names the agent: kept as decoded, for the oracle.
                let info = match &outcome {
                    Ok(result) => match result.parse::<Value>() {
                        Ok(Value::Object(mut answer)) => answer.remove("agentInfo"),
                        _ => None,
                    },
                    Err(_) => None,
                };
                let ok = match &outcome {
                    Ok(result) => Some(stop_reason(result).unwrap_or_default()),
                    Err(_) => None,
                };
                self.record(Item::Answer {
                    id: id.clone(),
                    ok: ok.clone(),
                });
                if let Some(info) = info {
                    let mut log = lock(&self.ctx.log);
                    let line = log.conns[self.conn].lines.last().copied().unwrap_or(0);
                    log.agent_infos.push((self.conn, line, info));
                }
                if let RequestId::Number(n) = id {
                    self.stray_answered(n, &outcome);
                    self.answered(n, &outcome);
                }
            }
            Ok(Frame::Request { id, method, params }) => {
                let RequestId::Number(id) = id else { return };
                if method == "session/request_permission" {
                    let tool = tool_call_id(&params).unwrap_or_default();
                    self.record(Item::Asked {
                        id,
                        tool: tool.clone(),
                    });
                    self.permission(id, tool);
                } else {
                    let line = encode_response(
                        &RequestId::Number(id),
                        &Err::<Value, _>(RpcError::new(-32601, "Method not found")),
                    );
                    let at = self.now();
                    self.write_at(at, line, None);
                }
            }
            Ok(Frame::Notification { method, params }) => {
                if method == "session/update" {
                    let (marker, history, digest) = update_of(&params);
                    self.record(Item::Update {
                        marker,
                        history,
                        digest,
                    });
                } else if method == palisade_engine::proxy::CONVERSATION_REPLACED {
                    self.record(Item::Replaced);
                }
            }
            Err(_) => {}
        }
    }

    /// Answers (or not) the permission request shown as `id`.
    fn permission(&mut self, id: i64, tool: String) {
        let key = self.key(id as u64, 1);
        let how = match key % 100 {
            0..=44 => Answering::Promptly,
            45..=59 => Answering::Late,
            60..=69 => Answering::Never,
            70..=79 => Answering::Twice,
            80..=87 => Answering::Refused,
            _ => Answering::WrongId,
        };
        self.note(how.name(), &[("id", id as u64)]);
        self.asked.insert(id, tool.clone());
        let now = self.now();
        let answer = |tool: &str| json!({"outcome": {"outcome": "selected", "optionId": "allow"}, "_meta": {"answers": tool}});
        let soon = now + pick(self.key(id as u64, 2), 0, 30);
        match how {
            Answering::Never => {}
            Answering::Promptly | Answering::Late | Answering::Twice => {
                let at = if how == Answering::Late {
                    now + pick(self.key(id as u64, 3), 200, LATE_MS)
                } else {
                    soon
                };
                let times = if how == Answering::Twice { 2 } else { 1 };
                for k in 0..times {
                    let line = encode_response(&RequestId::Number(id), &Ok(answer(&tool)));
                    self.write_at(
                        at + k * pick(self.key(id as u64, 4), 0, 200),
                        line,
                        Some(Item::Answered {
                            id,
                            tool: tool.clone(),
                        }),
                    );
                }
            }
            Answering::Refused => {
                let line = encode_response(
                    &RequestId::Number(id),
                    &Err::<Value, _>(
                        RpcError::new(-32000, "refused by the user")
                            .with_data(json!({"answers": tool.clone()})),
                    ),
                );
                self.write_at(soon, line, Some(Item::Answered { id, tool }));
            }
            Answering::WrongId => {
                // Another request's id, answered or not, or one never sent.
                let others: Vec<i64> = self.asked.keys().copied().filter(|k| *k != id).collect();
                let wrong = if others.is_empty() || self.key(id as u64, 5).is_multiple_of(3) {
                    id + 1_000
                } else {
                    others[(self.key(id as u64, 6) % others.len() as u64) as usize]
                };
                // An answer under an id answers the request shown under it, whatever the
                // client meant: it names that one (or none).
                let shown = self
                    .asked
                    .get(&wrong)
                    .cloned()
                    .unwrap_or_else(|| "never-shown".to_owned());
                let line = encode_response(&RequestId::Number(wrong), &Ok(answer(&shown)));
                self.write_at(
                    soon,
                    line,
                    Some(Item::Answered {
                        id: wrong,
                        tool: shown,
                    }),
                );
            }
        }
    }

    /// Records the answer if `n` is one of the stray requests.
    fn stray_answered(&mut self, n: i64, outcome: &Result<RawJson, RpcError>) {
        let conn = self.conn;
        let mut log = lock(&self.ctx.log);
        if let Some(stray) = log.strays.iter_mut().find(|s| s.conn == conn && s.id == n) {
            stray
                .answers
                .push(outcome.as_ref().map(|_| ()).map_err(|e| e.code));
        }
    }

    /// An answer to the client's request `n`.
    fn answered(&mut self, n: i64, outcome: &Result<RawJson, RpcError>) {
        match self.phase {
            Phase::Initializing(id) if id == n => match outcome {
                // An agent that offers auth methods is authenticated with the first, as
                // an editor does with the method its user chose.
                Ok(result) => match auth_method(result) {
                    Some(method) => self.authenticate(method, 0),
                    None => self.open(0),
                },
                // The agent the proxy asked went away, say: the user tries again (in
                // scenarios whose agents ask for authentication; elsewhere the client goes
                // on, as it always did).
                Err(_) if self.ctx.reinitialize => {
                    let id = self.request(100, "initialize", hello(), None);
                    self.phase = Phase::Initializing(id);
                }
                Err(_) => self.open(0),
            },
            Phase::Authenticating {
                id,
                ref method,
                tries,
            } if id == n => {
                let now = self.now();
                let conn = self.conn;
                if let Some(auth) = lock(&self.ctx.log)
                    .auths
                    .iter_mut()
                    .find(|a| a.conn == conn && a.id == id)
                {
                    auth.answer = Some((now, outcome.is_ok()));
                }
                if outcome.is_err() && tries + 1 < OPEN_TRIES {
                    // The agent the proxy asked went away, say: the user tries again.
                    let method = method.clone();
                    self.authenticate(method, tries + 1);
                } else {
                    self.open(0);
                }
            }
            Phase::Opening { id, load, tries } if id == n => match outcome {
                Ok(result) => {
                    if !load {
                        lock(&self.ctx.log).label = session_id(result);
                    }
                    self.phase = Phase::Idle;
                    self.next_prompt();
                }
                Err(error) => {
                    if load && error.code == -32002 {
                        // The proxy does not know the session (its state never held it):
                        // a new one.
                        lock(&self.ctx.log).label = None;
                    }
                    if tries + 1 < OPEN_TRIES {
                        self.open(tries + 1);
                    } else {
                        self.phase = Phase::Idle;
                    }
                }
            },
            Phase::Prompting { id, send } if id == n => {
                if let Some(key) = self.cancel.take() {
                    self.due.remove(&key);
                }
                let k = {
                    let mut log = lock(&self.ctx.log);
                    let k = log.sends[send].k;
                    log.answered.entry(k).or_insert(send);
                    k
                };
                let _ = k;
                self.phase = Phase::Idle;
                self.next_prompt();
            }
            _ => {}
        }
    }

    /// `authenticate` with `method` (the `tries`-th time on this connection).
    fn authenticate(&mut self, method: String, tries: u32) {
        let after = if tries == 0 { 0 } else { 100 };
        let id = self.request(
            after,
            "authenticate",
            json!({"methodId": method.as_str()}),
            None,
        );
        lock(&self.ctx.log).auths.push(Auth {
            conn: self.conn,
            id,
            answer: None,
        });
        self.phase = Phase::Authenticating { id, method, tries };
    }

    /// `session/new`, or `session/load` of the session it has.
    fn open(&mut self, tries: u32) {
        let label = lock(&self.ctx.log).label.clone();
        let after = if tries == 0 { 0 } else { 100 };
        let (id, load) = match label {
            Some(label) => (
                self.request(
                    after,
                    "session/load",
                    json!({"sessionId": label, "cwd": "/work", "mcpServers": []}),
                    None,
                ),
                true,
            ),
            None => (
                self.request(
                    after,
                    "session/new",
                    json!({"cwd": "/work", "mcpServers": []}),
                    None,
                ),
                false,
            ),
        };
        self.phase = Phase::Opening { id, load, tries };
    }

    /// The next unanswered prompt, after a think time; done when none is left.
    fn next_prompt(&mut self) {
        let (next, label) = {
            let log = lock(&self.ctx.log);
            let next = (0..self.ctx.prompts).find(|k| !log.answered.contains_key(k));
            (next, log.label.clone())
        };
        let (Some(k), Some(label)) = (next, label) else {
            self.phase = Phase::Done;
            return;
        };
        let text = format!("prompt-{} c{}", k + 1, self.conn);
        // The send this prompt will be (its index in the log), for the draws below.
        let next_send = lock(&self.ctx.log).sends.len();
        let think = pick(
            self.key(next_send as u64, 7),
            self.ctx.think.0,
            self.ctx.think.1,
        )
        .max(1);
        if self.ctx.set_mode > 0.0 && chance(self.key(next_send as u64, 10), self.ctx.set_mode) {
            // A session method the proxy forwards to the session's agent; its answer is
            // not waited for.
            let mode = format!("mode-{next_send}");
            let id = self.request(
                think / 2,
                "session/set_mode",
                json!({"sessionId": label, "modeId": mode}),
                None,
            );
            lock(&self.ctx.log).modes.push((self.conn, id, mode));
        }
        if self.ctx.stray > 0.0 && chance(self.key(next_send as u64, 11), self.ctx.stray) {
            // A request naming a session the proxy never minted: it must be refused and
            // reach no agent.
            let tag = format!("stray-{}-c{}!", next_send, self.conn);
            let (method, params) = if chance(self.key(next_send as u64, 12), 0.5) {
                (
                    "session/prompt",
                    json!({"sessionId": tag, "prompt": [{"type": "text", "text": tag}]}),
                )
            } else {
                ("session/set_mode", json!({"sessionId": tag, "modeId": tag}))
            };
            let id = self.request(think / 3, method, params, None);
            lock(&self.ctx.log).strays.push(Stray {
                conn: self.conn,
                id,
                method,
                tag,
                answers: Vec::new(),
            });
        }
        let send = {
            let mut log = lock(&self.ctx.log);
            log.sends.push(PromptSend {
                k,
                text: text.clone(),
                conn: self.conn,
                id: self.next_id,
            });
            log.sends.len() - 1
        };
        let id = self.request(
            think,
            "session/prompt",
            json!({"sessionId": label, "prompt": [{"type": "text", "text": text}]}),
            Some(send),
        );
        self.phase = Phase::Prompting { id, send };
        if chance(self.key(send as u64, 8), 0.25) {
            let at = self.now() + think + pick(self.key(send as u64, 9), 1, 400);
            let line = encode_message(None, "session/cancel", Some(&json!({"sessionId": label})));
            self.cancel = Some(self.write_at(at, line, None));
        }
    }
}

/// The `stopReason` of a prompt's answer (`None` for other results).
fn stop_reason(result: &RawJson) -> Option<String> {
    let value: Value = result.parse().ok()?;
    Some(value.get("stopReason")?.as_str()?.to_owned())
}

/// The client's `initialize` params.
fn hello() -> Value {
    json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false}}})
}

/// The first auth method an `initialize` answer offers.
fn auth_method(result: &RawJson) -> Option<String> {
    let value: Value = result.parse().ok()?;
    Some(
        value
            .get("authMethods")?
            .as_array()?
            .first()?
            .get("id")?
            .as_str()?
            .to_owned(),
    )
}

/// The `sessionId` of `session/new`'s answer.
fn session_id(result: &RawJson) -> Option<String> {
    let value: Value = result.parse().ok()?;
    Some(value.get("sessionId")?.as_str()?.to_owned())
}

fn tool_call_id(params: &RawJson) -> Option<String> {
    let value: Value = params.parse().ok()?;
    Some(
        value
            .get("toolCall")?
            .get("toolCallId")?
            .as_str()?
            .to_owned(),
    )
}

/// An update's marker (`<tag>#<k>`), whether it is a history line, and the digest of the
/// content the client decoded ([`wire_text::update_digest`]).
pub(crate) fn update_of(params: &RawJson) -> (Option<String>, bool, Option<u64>) {
    let Ok(value) = params.parse::<Value>() else {
        return (None, false, None);
    };
    let update = &value["update"];
    let digest = wire_text::update_digest(update);
    let text = if update["sessionUpdate"] == "tool_call" {
        update["toolCallId"].as_str()
    } else {
        update["content"]["text"]
            .as_str()
            .or_else(|| update["content"]["resource"]["text"].as_str())
    };
    let Some(text) = text else {
        return (None, false, digest);
    };
    if text.starts_with("history ") {
        return (None, true, digest);
    }
    let first = text.split(' ').next().unwrap_or_default();
    (first.contains('#').then(|| first.to_owned()), false, digest)
}
