//! The attention kernels' non-finite flags (`bad` in `attention.wgsl`) are ordered by barriers:
//! a static check of every attention module's entry points, over naga's IR, without an adapter.
//!
//! Why a static check: the flags are shared by the threads of a workgroup. A clear
//! (`clear_flags`), a flag write (`note`, an atomic OR) and a flag read (`atomicLoad`) of
//! different threads race unless a barrier separates them, and a lost flag sends a tile down
//! the fast path where 0 x NaN reaches rows that must stay finite. The GPU conformance suite
//! found one such race on NVIDIA; lavapipe runs a workgroup's threads in order and can never
//! show one. So every path through each kernel is walked here instead.
//!
//! The model: since the last barrier (`workgroupBarrier`, or the barriers of
//! `workgroupUniformLoad`) a path may have cleared, written or read the flags. Two different
//! kinds of access in one barrier phase are a race (writes commute with each other, reads with
//! reads); the path's state is the set of kinds seen since its last barrier, and a kernel's
//! states are followed through branches (both sides), loops (to a fixed point) and calls.
//! `note(seen, which)` with `which` 0 (a literal, or a parameter every caller passes 0) writes
//! nothing and is no access. It is conservative about branches: an access under a condition
//! counts, because another thread may take the branch.

use std::collections::{BTreeSet, HashMap};

use naga::{Block, Expression, Function, Handle, Literal, Module, Statement};

use super::Family;
use super::tests::attention_variants;
use crate::attention::AttnKind;

/// Accesses since the last barrier, one bit each; a path's state is one combination (0..8),
/// and a set of states is a bit mask over the 8 combinations.
const CLEARED: u8 = 1;
const WRITTEN: u8 = 2;
const READ: u8 = 4;

#[derive(Clone, Copy, Default)]
struct Flow {
    /// States that fall through, leave by `break`, by `continue`, or by `return`.
    next: u8,
    brk: u8,
    cont: u8,
    ret: u8,
}

impl Flow {
    fn fall(next: u8) -> Flow {
        Flow {
            next,
            ..Flow::default()
        }
    }
}

struct Walk<'m> {
    module: &'m Module,
    entry: String,
    races: BTreeSet<String>,
    /// (function, its parameters known to be 0, input states) -> its exit states.
    memo: HashMap<(Handle<Function>, u64, u8), u8>,
}

impl Walk<'_> {
    /// Every state of `states` after an access of `kind` (a race where it meets another kind).
    fn access(&mut self, states: u8, kind: u8, what: &str, func: &str) -> u8 {
        let mut out = 0;
        for s in 0..8u8 {
            if states & (1 << s) == 0 {
                continue;
            }
            if s & !kind != 0 {
                self.races.insert(format!(
                    "{}: {what} in `{func}` meets {} in the same barrier phase",
                    self.entry,
                    describe(s & !kind)
                ));
            }
            out |= 1 << (s | kind);
        }
        out
    }

    /// Whether `e` of `f` points into the workgroup variable `bad`.
    fn is_flag(&self, f: &Function, mut e: Handle<Expression>) -> bool {
        loop {
            match f.expressions[e] {
                Expression::Access { base, .. } | Expression::AccessIndex { base, .. } => e = base,
                Expression::GlobalVariable(g) => {
                    return self.module.global_variables[g].name.as_deref() == Some("bad");
                }
                _ => return false,
            }
        }
    }

    /// Whether argument `e` of a call in `f` is 0 (a literal, or a parameter in `zero`).
    fn is_zero(f: &Function, e: Handle<Expression>, zero: u64) -> bool {
        match f.expressions[e] {
            Expression::Literal(Literal::U32(0)) => true,
            Expression::FunctionArgument(i) => zero & (1 << i) != 0,
            _ => false,
        }
    }

    fn call(
        &mut self,
        states: u8,
        caller: &Function,
        zero: u64,
        callee: Handle<Function>,
        args: &[Handle<Expression>],
    ) -> u8 {
        let g = &self.module.functions[callee];
        let name = g.name.clone().unwrap_or_default();
        match name.as_str() {
            "clear_flags" => return self.access(states, CLEARED, "a clear", &name),
            "note" if args.get(1).is_some_and(|&w| Self::is_zero(caller, w, zero)) => {
                return states;
            }
            "note" => return self.access(states, WRITTEN, "a flag write", &name),
            _ => {}
        }
        let mut callee_zero = 0u64;
        for (i, &a) in args.iter().enumerate() {
            if Self::is_zero(caller, a, zero) {
                callee_zero |= 1 << i;
            }
        }
        let key = (callee, callee_zero, states);
        if let Some(&out) = self.memo.get(&key) {
            return out;
        }
        let flow = self.block(&g.body, g, callee_zero, states);
        let out = flow.next | flow.ret;
        self.memo.insert(key, out);
        out
    }

    fn block(&mut self, block: &Block, f: &Function, zero: u64, states: u8) -> Flow {
        let name = f.name.clone().unwrap_or_else(|| self.entry.clone());
        let mut flow = Flow::fall(states);
        for stmt in block.iter() {
            let s = flow.next;
            if s == 0 {
                break; // every path left this block
            }
            match stmt {
                Statement::Emit(range) => {
                    for e in range.clone() {
                        if let Expression::Load { pointer } = f.expressions[e]
                            && self.is_flag(f, pointer)
                        {
                            flow.next = self.access(flow.next, READ, "a flag read", &name);
                        }
                    }
                }
                Statement::Block(b) => flow = merge(flow, self.block(b, f, zero, s)),
                Statement::If { accept, reject, .. } => {
                    let a = self.block(accept, f, zero, s);
                    let r = self.block(reject, f, zero, s);
                    flow = merge(flow, join(a, r));
                }
                Statement::Switch { cases, .. } => {
                    let mut all = Flow::default();
                    let mut fall = 0;
                    for case in cases {
                        let c = self.block(&case.body, f, zero, s | fall);
                        fall = if case.fall_through { c.next } else { 0 };
                        all = join(
                            all,
                            Flow {
                                brk: 0,
                                next: c.next | c.brk,
                                ..c
                            },
                        );
                    }
                    flow = merge(flow, all);
                }
                Statement::Loop {
                    body,
                    continuing,
                    break_if,
                } => {
                    let l = self.looped(body, continuing, break_if.is_some(), f, zero, s);
                    flow = merge(flow, l);
                }
                Statement::Break => {
                    flow.brk |= s;
                    flow.next = 0;
                }
                Statement::Continue => {
                    flow.cont |= s;
                    flow.next = 0;
                }
                Statement::Return { .. } => {
                    flow.ret |= s;
                    flow.next = 0;
                }
                Statement::Kill => flow.next = 0,
                // A barrier over workgroup memory (workgroupBarrier, or the two of
                // workgroupUniformLoad); a storage- or subgroup-only one orders nothing here.
                Statement::ControlBarrier(b) if b.contains(naga::Barrier::WORK_GROUP) => {
                    flow.next = 1; // the state with nothing seen since the barrier
                }
                Statement::WorkGroupUniformLoad { .. } => flow.next = 1,
                Statement::Store { pointer, .. } if self.is_flag(f, *pointer) => {
                    flow.next = self.access(s, CLEARED, "a flag store", &name);
                }
                Statement::Atomic { pointer, .. } if self.is_flag(f, *pointer) => {
                    flow.next = self.access(s, WRITTEN, "an atomic on the flags", &name);
                }
                Statement::Call {
                    function,
                    arguments,
                    ..
                } => {
                    flow.next = self.call(s, f, zero, *function, arguments);
                }
                _ => {}
            }
        }
        flow
    }

    /// A loop to a fixed point of the states at its head: the body, then the continuing block
    /// (after the body or a `continue`), then back to the head (or out, with `break_if`).
    fn looped(
        &mut self,
        body: &Block,
        continuing: &Block,
        break_if: bool,
        f: &Function,
        zero: u64,
        entry: u8,
    ) -> Flow {
        let mut head = entry;
        loop {
            let b = self.block(body, f, zero, head);
            let c = self.block(continuing, f, zero, b.next | b.cont);
            let again = head | c.next;
            if again == head {
                let out = b.brk | c.brk | if break_if { c.next } else { 0 };
                return Flow {
                    next: out,
                    ret: b.ret | c.ret,
                    ..Flow::default()
                };
            }
            head = again;
        }
    }
}

/// A block's flow appended to what came before it: its fall-through replaces `before`'s.
fn merge(before: Flow, b: Flow) -> Flow {
    Flow {
        next: b.next,
        brk: before.brk | b.brk,
        cont: before.cont | b.cont,
        ret: before.ret | b.ret,
    }
}

fn join(a: Flow, b: Flow) -> Flow {
    Flow {
        next: a.next | b.next,
        brk: a.brk | b.brk,
        cont: a.cont | b.cont,
        ret: a.ret | b.ret,
    }
}

fn describe(kinds: u8) -> String {
    let names = [
        (CLEARED, "a clear"),
        (WRITTEN, "a flag write"),
        (READ, "a flag read"),
    ];
    let seen: Vec<&str> = names
        .iter()
        .filter(|(k, _)| kinds & k != 0)
        .map(|(_, n)| *n)
        .collect();
    seen.join(" and ")
}

/// The races of every entry point of `src` (empty: every flag access is ordered).
fn races(src: &str) -> Vec<String> {
    let module = naga::front::wgsl::parse_str(src).expect("parses");
    let mut out = Vec::new();
    for ep in &module.entry_points {
        let mut walk = Walk {
            module: &module,
            entry: ep.name.clone(),
            races: BTreeSet::new(),
            memo: HashMap::new(),
        };
        walk.block(&ep.function.body, &ep.function, 0, 1);
        out.extend(walk.races);
    }
    out
}

#[test]
fn every_attention_kernel_orders_its_flags_by_barriers() {
    let mut checked = 0;
    for cfg in attention_variants() {
        let family = Family::Attention(cfg);
        for subgroups in [false, true] {
            let found = races(&family.source(subgroups));
            assert!(found.is_empty(), "{}: {found:#?}", family.label(subgroups));
            checked += 1;
        }
    }
    println!("{checked} attention modules: every flag access ordered by barriers");
}

/// The check fails on the race the H100 found: the subgroup backward kernels clearing their
/// flags at each step right before staging the flagged tiles (as before `clear_flags` moved in
/// front of `list_bounds`): `attn_dkdv_sg` (Q and d_out) and `attn_dq_sg` (K).
#[test]
fn the_flag_check_catches_the_races_it_is_for() {
    let source = |kind| {
        let cfg = attention_variants()
            .into_iter()
            .find(|c| c.sg && c.kind == kind && c.dp == 128)
            .expect("a subgroup variant at head dim 128");
        Family::Attention(cfg).source(true)
    };
    let planted = [
        (
            AttnKind::Dkdv,
            "attn_dkdv_sg",
            "list_bounds(p.koff_at",
            "        let h = step.y;\n",
        ),
        (
            AttnKind::Dq,
            "attn_dq_sg",
            "list_bounds(0u, qt",
            "        let k0 = (w & ~FULL) * BK;\n",
        ),
    ];
    for (kind, entry, bounds, step) in planted {
        let src = source(kind);
        // The subgroup kernel's own text (its module holds the plain kernel's too).
        let at = src.find(&format!("fn {entry}(")).expect("the entry point");
        let (head, tail) = src.split_at(at);
        let tail_moved = tail
            .replacen("\n    clear_flags(lid);\n", "\n", 1)
            .replacen(step, &format!("{step}        clear_flags(lid);\n"), 1);
        let moved = format!("{head}{tail_moved}");
        assert!(
            tail.contains(bounds)
                && !tail_moved.contains("\n    clear_flags(lid);\n")
                && tail_moved.contains(&format!("{step}        clear_flags(lid);\n")),
            "{entry}: the plant did not apply"
        );
        assert!(races(&src).is_empty());
        let found = races(&moved);
        assert!(
            found
                .iter()
                .any(|r| r.starts_with(entry) && r.contains("a clear")),
            "{entry}: the per-step clear was not caught: {found:?}"
        );
    }
    // And a read in the phase of the writes: attn_dkdv_sg without the two barriers between
    // staging (which writes the flags) and the accumulation (which reads them).
    let src = source(AttnKind::Dkdv);
    let at = src.find("fn attn_dkdv_sg(").expect("the entry point");
    let (head, tail) = src.split_at(at);
    let unfenced = tail.replacen("        workgroupBarrier();\n", "", 2);
    assert_eq!(
        unfenced.len() + 2 * 28,
        tail.len(),
        "the plant did not apply"
    );
    let found = races(&format!("{head}{unfenced}"));
    assert!(
        found
            .iter()
            .any(|r| r.starts_with("attn_dkdv_sg") && r.contains("a flag read")),
        "the unfenced read was not caught: {found:?}"
    );
}
