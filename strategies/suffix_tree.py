"""SuffixTree: a depth-limited suffix trie over token streams, with occurrence counts.

Every substring of length <= max_depth of the stored streams is a node; `count[node]` is how many
times that substring occurs, `cont[node]` how many of those occurrences are followed by another
token (the sum of the children's counts). The continuation probability of a child is
count[child] / cont[node]: an occurrence at the very end of a stream says nothing about what
follows, so unlike Arctic Inference's count[child] / count[node] it does not dilute the estimate.

Appending one token to a stream extends the (up to max_depth) open suffixes of that stream by one
node each: O(max_depth) work per token whatever the history (SuffixDecoding, Oliaro et al. 2025;
Arctic Inference's suffix_tree.cc does the same on path-compressed nodes). Removing a stream walks
its suffixes back down and frees the nodes whose count drops to zero.

Nodes live in flat arrays (struct of arrays, ids reused through a free list) and only nodes with
two or more children own a dict: most nodes of a suffix trie are single-child chains, and a dict
per node would cost ~200 bytes each.
"""
from __future__ import annotations

import heapq
import itertools
from array import array
from typing import Iterable, Iterator, Sequence

NO_CHILD = -1      # child_token value: a leaf
BRANCHING = -2     # child_token value: the children are in `branches[node]`
ROOT = 0


class SuffixTree:
    def __init__(self, max_depth: int):
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = int(max_depth)
        self.count = array("q", [0])         # node -> occurrences of its substring
        self.cont = array("q", [0])          # node -> occurrences followed by a token (sum of children's counts)
        self.child_token = array("q", [NO_CHILD])   # node -> its only child's token, NO_CHILD or BRANCHING
        self.child_node = array("q", [NO_CHILD])    # node -> its only child (when child_token >= 0)
        self.branches: dict[int, dict[int, int]] = {}   # node -> {token: child}, nodes with 2+ children
        self.free: list[int] = []            # ids of removed nodes, reused first
        self.streams: dict[int, array] = {}  # stream id -> its tokens
        self.open: dict[int, list[int]] = {}  # stream id -> nodes of its last suffixes, [k] = length-k suffix
        #                                       (k < max_depth: the ones the next token extends); [0] = root
        self.num_tokens = 0

    # ------------------------------------------------------------------ nodes
    def child(self, node: int, token: int) -> int:
        """The child of `node` for `token`, or -1."""
        only = self.child_token[node]
        if only == BRANCHING:
            return self.branches[node].get(token, -1)
        return self.child_node[node] if only == token else -1

    def children(self, node: int) -> Iterator[tuple[int, int]]:
        """(token, child) pairs of `node`."""
        only = self.child_token[node]
        if only == BRANCHING:
            yield from self.branches[node].items()
        elif only != NO_CHILD:
            yield only, self.child_node[node]

    def _new_node(self) -> int:
        if self.free:
            node = self.free.pop()
            self.count[node] = self.cont[node] = 0
            self.child_token[node] = self.child_node[node] = NO_CHILD
            return node
        for column in (self.count, self.cont, self.child_token, self.child_node):
            column.append(0)
        node = len(self.count) - 1
        self.child_token[node] = self.child_node[node] = NO_CHILD
        return node

    def _add_child(self, node: int, token: int) -> int:
        child = self._new_node()
        only = self.child_token[node]
        if only == NO_CHILD:
            self.child_token[node], self.child_node[node] = token, child
        elif only == BRANCHING:
            self.branches[node][token] = child
        else:
            self.branches[node] = {only: self.child_node[node], token: child}
            self.child_token[node], self.child_node[node] = BRANCHING, NO_CHILD
        return child

    def _drop_child(self, node: int, token: int) -> None:
        only = self.child_token[node]
        if only == BRANCHING:
            kids = self.branches[node]
            child = kids.pop(token)
            if len(kids) == 1:          # back to the compact single-child form
                (last_token, last_child), = kids.items()
                del self.branches[node]
                self.child_token[node], self.child_node[node] = last_token, last_child
        else:
            child = self.child_node[node]
            self.child_token[node] = self.child_node[node] = NO_CHILD
        self.free.append(child)

    @property
    def num_nodes(self) -> int:
        return len(self.count) - len(self.free)

    # ------------------------------------------------------------------ streams
    def extend(self, stream: int, tokens: Iterable[int]) -> None:
        """Append tokens to a stream (a new id starts one): O(max_depth) per token."""
        if stream not in self.streams:
            self.streams[stream] = array("q")
            self.open[stream] = [ROOT]
        store, open_nodes = self.streams[stream], self.open[stream]
        count, cont, depth = self.count, self.cont, self.max_depth
        child_token, child_node, branches = self.child_token, self.child_node, self.branches
        free = self.free
        for token in tokens:
            token = int(token)
            grown = [ROOT]
            for node in open_nodes:             # the suffixes of length k become length k + 1
                only = child_token[node]        # self.child(node, token), inlined: the hot loop
                if only == token:
                    child = child_node[node]
                elif only == BRANCHING and token in branches[node]:
                    child = branches[node][token]
                elif free or only != NO_CHILD:
                    child = self._add_child(node, token)
                else:                           # a new leaf below a leaf, no id to reuse: _add_child inlined
                    child = len(count)          # (most substrings of a long stream are new)
                    count.append(0)
                    cont.append(0)
                    child_token.append(NO_CHILD)
                    child_node.append(NO_CHILD)
                    child_token[node] = token
                    child_node[node] = child
                count[child] += 1
                cont[node] += 1
                grown.append(child)
            if len(grown) > depth:              # a max_depth-long suffix is not extended further
                grown.pop()
            count[ROOT] += 1
            open_nodes = grown
            store.append(token)
        self.open[stream] = open_nodes
        self.num_tokens = int(self.count[ROOT])

    def remove(self, stream: int) -> None:
        """Forget a stream: every substring occurrence it added is taken back."""
        store = self.streams.pop(stream)
        del self.open[stream]
        count, cont = self.count, self.cont
        for start in range(len(store)):
            node = ROOT
            count[ROOT] -= 1
            for token in store[start: start + self.max_depth]:
                child = self.child(node, token)
                cont[node] -= 1
                count[child] -= 1
                if count[child] == 0:           # no occurrence left: nor any below it (counts only shrink down)
                    self._free_subtree(node, token, child)
                    break
                node = child
        self.num_tokens = int(self.count[ROOT])

    def _free_subtree(self, parent: int, token: int, child: int) -> None:
        stack = [child]
        self._drop_child(parent, token)         # frees `child`
        while stack:
            node = stack.pop()
            for kid_token, kid in list(self.children(node)):
                stack.append(kid)
                self._drop_child(node, kid_token)
            self.branches.pop(node, None)
            self.child_token[node] = self.child_node[node] = NO_CHILD

    # ------------------------------------------------------------------ matching
    def match(self, suffix: Sequence[int]) -> int:
        """The node of `suffix`, or -1 when it does not occur."""
        node = ROOT
        for token in suffix:
            node = self.child(node, int(token))
            if node < 0:
                return -1
        return node

    def matches(self, context: Sequence[int], max_len: int) -> Iterator[tuple[int, int]]:
        """(match length, node) of the context's suffixes that occur, shortest first (a longer
        suffix only occurs where every shorter one does, so the walk stops at the first miss)."""
        for length in range(1, min(max_len, len(context)) + 1):
            node = self.match(context[len(context) - length:])
            if node < 0:
                return
            yield length, node

    def open_matches(self, stream: int) -> Iterator[tuple[int, int]]:
        """(match length, node) of a stream's own last suffixes (no walk: they are its open nodes)."""
        for length, node in enumerate(self.open.get(stream, ())[1:], start=1):
            yield length, node

    # ------------------------------------------------------------------ drafting
    def best_path(self, node: int, max_tokens: int, min_prob: float, stop: frozenset = frozenset()):
        """The most frequent continuation below `node` (best_path over this tree alone)."""
        return best_path([(self, node)], max_tokens, min_prob, stop)

    def best_tree(self, node: int, max_nodes: int, max_levels: int, min_prob: float,
                  stop: frozenset = frozenset()):
        """The max_nodes most probable continuation nodes below `node` (best_tree over this tree alone)."""
        return best_tree([(self, node)], max_nodes, max_levels, min_prob, stop)

    # ------------------------------------------------------------------ checks
    def as_counts(self) -> dict[tuple[int, ...], tuple[int, int]]:
        """{substring: (count, cont)} of every node but the root: two trees with equal views hold
        the same substrings with the same counts (what the rebuild-equals-update test compares)."""
        out: dict[tuple[int, ...], tuple[int, int]] = {}
        stack: list[tuple[int, tuple[int, ...]]] = [(ROOT, ())]
        while stack:
            node, path = stack.pop()
            for token, child in self.children(node):
                key = path + (token,)
                out[key] = (int(self.count[child]), int(self.cont[child]))
                stack.append((child, key))
        return out

    def memory_bytes(self) -> int:
        """An estimate of what the tree holds: node arrays, branch dicts and stored streams."""
        import sys
        arrays = sum(column.buffer_info()[1] * column.itemsize
                     for column in (self.count, self.cont, self.child_token, self.child_node))
        dicts = sys.getsizeof(self.branches) + sum(sys.getsizeof(kids) for kids in self.branches.values())
        streams = sum(store.buffer_info()[1] * store.itemsize for store in self.streams.values())
        opened = sum(8 * len(nodes) for nodes in self.open.values())
        return arrays + dicts + streams + opened


# ---------------------------------------------------------------------- drafting over several trees
# A match is drafted from every tree that holds it at once: `parts` is a list of (tree, node), the
# node of the same substring in each tree, and a continuation's count is the sum over the trees. So
# what this call's own output repeats and what earlier outputs say about the same match add up (as
# in Arctic Inference, whose global tree also holds the active response), while each tree stays
# separate: a call's output joins the shared cache only when the call finishes.

def _children(parts: Sequence[tuple[SuffixTree, int]]) -> dict[int, list]:
    """{token: [summed count, [(tree, child), ...]]} of the parts' children, in first-seen order."""
    merged: dict[int, list] = {}
    for tree, node in parts:
        for token, child in tree.children(node):
            entry = merged.get(token)
            if entry is None:
                merged[token] = [int(tree.count[child]), [(tree, child)]]
            else:
                entry[0] += int(tree.count[child])
                entry[1].append((tree, child))
    return merged


def _cont(parts: Sequence[tuple[SuffixTree, int]]) -> int:
    return sum(int(tree.cont[node]) for tree, node in parts)


def best_path(parts, max_tokens: int, min_prob: float, stop: frozenset = frozenset()):
    """The most frequent continuation below the match `parts`: follow the most frequent child while
    the path's probability (product of child count / continuations, summed over the trees) stays
    >= min_prob. Returns (tokens, parents, probs)."""
    tokens: list[int] = []
    probs: list[float] = []
    prob = 1.0
    while len(tokens) < max_tokens:
        total = _cont(parts)
        if total <= 0:
            break
        best_token, (count, below) = max(_children(parts).items(), key=lambda item: item[1][0])
        prob *= count / total
        if prob < min_prob:
            break
        tokens.append(best_token)
        probs.append(prob)
        if best_token in stop:                  # nothing is proposed past an end of sequence
            break
        parts = below
    return tokens, list(range(-1, len(tokens) - 1)), probs


def best_tree(parts, max_nodes: int, max_levels: int, min_prob: float, stop: frozenset = frozenset()):
    """The `max_nodes` most probable continuation nodes below the match `parts` (each with path
    probability >= min_prob, at most max_levels deep), best first, as Arctic Inference's tree mode:
    a node always comes after its parent, since a child is never more probable and ties go to the
    one pushed first. Returns (tokens, parents, probs)."""
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    heap: list[tuple] = []                  # (-prob, order, token, parts below, draft parent, level)
    pushed = itertools.count()              # tie-break: first pushed, first proposed (parents before children)
    _push_children(heap, pushed, parts, 1.0, -1, 1, min_prob)
    while heap and len(tokens) < max_nodes:
        neg_prob, _, token, below, parent, level = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        probs.append(-neg_prob)
        if token not in stop and level < max_levels:   # nothing is proposed past an end of sequence
            _push_children(heap, pushed, below, -neg_prob, len(tokens) - 1, level + 1, min_prob)
    return tokens, parents, probs


def _push_children(heap: list, pushed: Iterator[int], parts, prob: float, draft_parent: int, level: int,
                   min_prob: float) -> None:
    total = _cont(parts)
    if total <= 0:
        return
    for token, (count, below) in _children(parts).items():
        child_prob = prob * count / total
        if child_prob >= min_prob:
            heapq.heappush(heap, (-child_prob, next(pushed), token, below, draft_parent, level))
