"""The node's own commands, apart from the coordinator's per-job ones (`cloudtrain.node`):
the resident agent, a scheduler's notice, and autostop (their usage is in
`cloudtrain.node`'s docstring)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from cloudtrain.node import agent, notices, selfstop, unattended
from cloudtrain.node.procs import tell_job


def main(words: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cloudtrain.node",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_agent = sub.add_parser("agent")
    p_agent.add_argument("--root", type=Path, required=True)
    p_agent.add_argument("--source", choices=sorted(notices.ENDPOINTS))
    p_agent.add_argument("--endpoint", help="the metadata server (default: the cloud's own)")
    mode = p_agent.add_mutually_exclusive_group()
    mode.add_argument("--ensure", action="store_true", help="start it detached, supervised")
    mode.add_argument("--supervise", action="store_true", help="run it, again when it dies")
    p_agent.add_argument(
        "--wait", type=float, default=0.0, help="--ensure: seconds to wait for its first beat"
    )
    p_agent.add_argument(
        "--halt",
        nargs="?",
        const=selfstop.POWEROFF,
        choices=selfstop.KINDS,
        help="a cloud node: how it stops itself (default: power off)",
    )
    p_agent.add_argument("--arm", help="Azure Resource Manager (default: the public cloud's)")
    _policy_args(p_agent)
    p_notice = sub.add_parser(
        "notice", help="a scheduler's notice that the node goes: record it, tell the job"
    )
    p_notice.add_argument("--root", type=Path, required=True)
    p_notice.add_argument("--source", required=True, help="who said it (slurm, …)")
    p_notice.add_argument("--action", default="end", help="what it will do (end, preempt …)")
    p_notice.add_argument("--not-before", help="when, as the scheduler says it")
    p_stop = sub.add_parser("autostop")
    p_stop.add_argument("--root", type=Path, required=True)
    p_stop.add_argument("--off", action="store_true", help="never stop when idle")
    _policy_args(p_stop)
    args = parser.parse_args(words)

    if args.command == "agent":
        return _agent(args)
    if args.command == "notice":  # a node whose scheduler signals it (Slurm's --signal)
        root = args.root.absolute()
        if not root.is_dir():  # not made yet, or gone: nothing runs there to tell
            print(f"cloudtrain: no node at {root}", file=sys.stderr)
            return 3
        notice = notices.Notice(args.source, args.action, args.not_before)
        told = tell_job(root, notice)
        print(json.dumps({**notice.to_dict(), "signalled": told}))
    elif args.command == "autostop":
        root = args.root.absolute()
        if not root.is_dir():  # never make a node's folder again: it went away
            print(f"cloudtrain: no node at {root} (it went away)", file=sys.stderr)
            return 3
        changes = _policy(args)
        if args.off:
            changes["idle_s"] = None
        if changes:
            agent.set_policy(root, **changes)
        print(json.dumps(unattended.tend(root)))  # a node with no agent: acted on
    return 0


def _policy_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--idle-s", type=float, help="stop after this many seconds idle")
    parser.add_argument(
        "--ends-in", type=float, metavar="SECONDS", help="stop this many seconds from now"
    )
    parser.add_argument("--why", choices=agent.ENDS, help="what the deadline is")
    parser.add_argument("--sessions", action=argparse.BooleanOptionalAction,
                        help="an SSH session of the user is work (not idle)")  # fmt: skip


def _policy(args: argparse.Namespace) -> dict[str, object]:
    """The policy fields the command line gives."""
    return {k: getattr(args, k) for k in agent.POLICY_FIELDS if getattr(args, k) is not None}


def _agent(args: argparse.Namespace) -> int:
    root = args.root.absolute()
    if args.ensure:
        print(json.dumps(agent.ensure(root, args.source, args.endpoint, wait_s=args.wait)))
        return 0
    if args.supervise:
        return agent.supervise(agent.argv(root, args.source, args.endpoint))
    if root.is_dir():
        agent.boot_policy(root, **_policy(args))
    return agent.resident(root, args.source, args.endpoint, halt=args.halt, arm=args.arm)
