"""A repository's commits held in memory, to answer the questions prepare asks of git
(the commits of a branch before a moment in git's --date-order, ancestry, the
descendants of a commit on some branches) without a git process per question: for a
campaign's scan, which asks them for thousands of requests of the same repositories.

Read once with two git commands (every commit reachable from a ref or HEAD with its
time, parents and subject; the refs), then plain Python. Where git's answer could differ
from this one (commits of one branch made in the same second, so the order between them
is git's own choice), the caller is told to ask git instead (`None`).

`--before` with `--date-order` is answered as git answers it without a commit-graph file
(its "limited" walk: the commits dated too late are dropped first, then the rest sorted,
a child dated too late no longer holding its parent back). With a commit-graph file git
walks incrementally and drops them after sorting, which orders a skewed clock's commits
otherwise; the caller asks git with `core.commitGraph=false`, so that git's answer does
not depend on whether `git gc` has written that file.

Plain Python (ground): no ORM, no replays module but the caller's git runner.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# git's answer to `log -z --format=%H%x1f%ct%x1f%P%x1f%s --all` and to `for-each-ref`.
LOG_ARGS = ["-c", "core.quotepath=off", "log", "-z", "--all", "--format=%H%x1f%ct%x1f%P%x1f%s"]
REFS_ARGS = ["for-each-ref", "--format=%(refname)%00%(objectname)%00%(objecttype)"]


@dataclass(frozen=True)
class Node:
    seconds: int  # committer time
    parents: tuple[str, ...]
    subject: bytes


@dataclass
class Graph:
    nodes: dict[str, Node]
    refs: dict[str, str]  # full ref name -> commit (only refs that name a commit)
    _orders: dict[tuple[str, ...], list[str]] = field(default_factory=dict)
    # per tips: the reachable commits, and the same newest first
    _by_time: dict[tuple[str, ...], tuple[set[str], list[str]]] = field(default_factory=dict)
    _children: dict[str, list[str]] | None = None
    _descendants: dict[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def read(cls, run: Callable[[list[str]], bytes]) -> Graph:
        """`run(args)` runs git in the repository and returns its stdout."""
        nodes: dict[str, Node] = {}
        for record in run(LOG_ARGS).split(b"\0"):
            record = record.lstrip(b"\n")
            if not record.strip():
                continue
            sha, seconds, parents, subject = record.split(b"\x1f", 3)
            nodes[sha.decode("ascii")] = Node(
                int(seconds), tuple(p.decode("ascii") for p in parents.split()), subject
            )
        refs = {}
        for line in run(REFS_ARGS).splitlines():
            name, _, rest = line.partition(b"\0")
            target, _, kind = rest.partition(b"\0")
            if kind == b"commit":
                refs[name.decode("utf-8", "surrogateescape")] = target.decode("ascii")
        return cls(nodes=nodes, refs=refs)

    def commit_of(self, ref: str) -> str | None:
        """A full sha known here, or a full ref name; None: ask git."""
        if ref in self.nodes:
            return ref
        return self.refs.get(ref)

    def date_order(self, refs: Iterable[str]) -> list[str] | None:
        """Every commit reachable from `refs` in git's --date-order: no parent before all
        its children (among these commits), otherwise newest first. None when two commits
        of the same second could come in either order (git decides: ask it)."""
        tips = tuple(sorted(set(refs)))
        if tips in self._orders:
            return self._orders[tips]
        reachable = self._reachable_from(tips)
        if reachable is None:
            return None
        waiting = dict.fromkeys(reachable, 0)
        for sha in reachable:
            for parent in self.nodes[sha].parents:
                if parent in waiting:
                    waiting[parent] += 1
        ready = [(self._age(sha), sha) for sha, count in waiting.items() if not count]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            seconds, sha = heapq.heappop(ready)
            if ready and ready[0][0] == seconds:
                return None  # two ready commits of one second: git's order is its own
            order.append(sha)
            for parent in self.nodes[sha].parents:
                if parent in waiting:
                    waiting[parent] -= 1
                    if not waiting[parent]:
                        heapq.heappush(ready, (self._age(parent), parent))
        self._orders[tips] = order
        return order

    def date_order_before(self, refs: Iterable[str], before: int, limit: int) -> list[str] | None:
        """The first `limit` commits of `git log --date-order --before=@BEFORE REFS` as git
        lists them without a commit-graph file: every commit reachable from `refs` dated
        `before` or earlier, no parent before all its children among these (a child dated
        later does not count), otherwise newest first. None where two ready commits of one
        second could come in either order (ask git).

        Only the commits it lists are visited (and their parents and children): the
        reachable ones are kept newest first per set of tips, and read from the first
        one dated `before` or earlier while none ready is newer."""
        tips = tuple(sorted(set(refs)))
        if tips not in self._by_time:
            reachable = self._reachable_from(tips)
            if reachable is None:
                return None
            newest = sorted(reachable, key=self._age)
            self._by_time[tips] = (reachable, newest)
        reachable, newest = self._by_time[tips]
        children = self._children_of()

        def listed(sha: str) -> bool:
            return sha in reachable and self.nodes[sha].seconds <= before

        waiting: dict[str, int] = {}  # listed commit -> its listed children not yet out

        def unresolved(sha: str) -> int:
            if sha not in waiting:
                waiting[sha] = sum(1 for child in children.get(sha, ()) if listed(child))
            return waiting[sha]

        ready: list[tuple[int, str]] = []
        queued: set[str] = set()
        order: list[str] = []
        position = bisect.bisect_left(newest, -before, key=self._age)
        while len(order) < limit:
            # every commit at least as new as the newest ready one, from the newest-first list
            while position < len(newest) and (
                not ready or self.nodes[newest[position]].seconds >= -ready[0][0]
            ):
                sha = newest[position]
                position += 1
                if sha not in queued and not unresolved(sha):
                    queued.add(sha)
                    heapq.heappush(ready, (self._age(sha), sha))
            if not ready:
                break
            seconds, sha = heapq.heappop(ready)
            if ready and ready[0][0] == seconds:
                return None  # two ready commits of one second: git's order is its own
            order.append(sha)
            # Once per time it is named, as `unresolved` counts a child once per time.
            for parent in self.nodes[sha].parents:
                if listed(parent):
                    waiting[parent] = unresolved(parent) - 1
                    if not waiting[parent] and parent not in queued:
                        queued.add(parent)
                        heapq.heappush(ready, (self._age(parent), parent))
        return order

    def _age(self, sha: str) -> int:
        """A sort key: newer commits first."""
        return -self.nodes[sha].seconds

    def _reachable_from(self, tips: Iterable[str]) -> set[str] | None:
        """Every commit reachable from the refs or commits `tips`; None if one is unknown."""
        starts = [self.commit_of(ref) for ref in tips]
        if any(start is None for start in starts):
            return None
        seen: set[str] = set()
        stack = [sha for sha in starts if sha is not None and sha in self.nodes]
        while stack:
            sha = stack.pop()
            if sha in seen:
                continue
            seen.add(sha)
            stack.extend(parent for parent in self.nodes[sha].parents if parent in self.nodes)
        return seen

    def is_ancestor(self, ancestor: str, descendant: str) -> bool | None:
        """git merge-base --is-ancestor; None when either is unknown here."""
        if ancestor not in self.nodes or descendant not in self.nodes:
            return None
        return descendant in self.descendants(ancestor) or ancestor == descendant

    def descendants(self, sha: str) -> frozenset[str]:
        """Every commit known here that has `sha` among its ancestors (not itself)."""
        if sha not in self._descendants:
            children = self._children_of()
            seen: set[str] = set()
            stack = list(children.get(sha, []))
            while stack:
                child = stack.pop()
                if child not in seen:
                    seen.add(child)
                    stack.extend(children.get(child, []))
            self._descendants[sha] = frozenset(seen)
        return self._descendants[sha]

    def _children_of(self) -> dict[str, list[str]]:
        if self._children is None:
            self._children = {}
            for child, node in self.nodes.items():
                for parent in node.parents:
                    self._children.setdefault(parent, []).append(child)
        return self._children
