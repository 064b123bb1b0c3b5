"""rest: Retrieval-Based Speculative Decoding (He et al. 2023) - draft from a corpus datastore.

`specdec index FILES... --out DIR --tokenizer TARGET` tokenizes the files once into a datastore on disk
(strategies/datastore.py: the token ids and their suffix array, memory-mapped, with the tokenizer's
fingerprint). Each step, the longest suffix of the context found in the corpus (rest.max_match down to
rest.min_match tokens) is looked up, the `depth` tokens after up to `max_occurrences` of its
occurrences are merged into a trie with counts, and the `max_nodes` most frequent nodes are the tree
(a child never counts more than its parent, so they hang together). Point masses: lossless under
every sampler. The datastore is opened at load and refused, with what to do, when it is not whole or
was built with another tokenizer than the target's.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence

from specdec.config import setting
from specdec.errors import ConfigError
from specdec.tree import CandidateTree, host_to_device
from specdec.types import DecodeState, StepResult

from .base import BaseStrategy
from .suffix import files_below
from .datastore import SORT_DEPTH, Datastore, DatastoreError, build, tokenizer_fingerprint

LOG = logging.getLogger(__name__)


@dataclass
class RestConfig:
    """The `rest:` section: the datastore (`specdec index` builds it) and the size of the drafted trie."""
    datastore: Optional[str] = None                  # the folder `specdec index ... --out` wrote
    min_match: int = setting(2, min=1)               # shortest context suffix looked up
    max_match: int = setting(16, min=1, max=SORT_DEPTH)   # longest (the datastore sorts suffixes this far)
    depth: int = setting(8, min=1)                   # tokens taken after each occurrence
    max_occurrences: int = setting(256, min=1)       # occurrences read per step (the first ones of the match)
    max_nodes: int = setting(16, min=1)              # trie nodes kept, the most frequent


CONFIG_SECTIONS = {"rest": RestConfig}


def frequent_trie(paths: Sequence[Sequence[int]], max_nodes: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the max_nodes most frequent nodes of the trie of `paths` (a node's count: the
    paths through it; ties to the node made first), parents before children."""
    tokens: list[int] = []
    parents: list[int] = []
    counts: list[int] = []
    child: dict[tuple[int, int], int] = {}
    for path in paths:
        parent = -1
        for token in path:
            node = child.get((parent, token))
            if node is None:
                node = child[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
                counts.append(0)
            counts[node] += 1
            parent = node
    keep = sorted(sorted(range(len(tokens)), key=lambda i: (-counts[i], i))[:max_nodes])
    new = {old: i for i, old in enumerate(keep)}
    return [tokens[i] for i in keep], [-1 if parents[i] == -1 else new[parents[i]] for i in keep]


class Rest(BaseStrategy):
    name = "rest"
    needs_hidden_states = False

    def __init__(self, datastore: str | None = None, *, min_match: int = RestConfig.min_match,
                 max_match: int = RestConfig.max_match, depth: int = RestConfig.depth,
                 max_occurrences: int = RestConfig.max_occurrences, max_nodes: int = RestConfig.max_nodes):
        if datastore is None:
            raise ConfigError("rest needs a datastore: build one with `specdec index FILES... --out DIR --tokenizer "
                              "TARGET` and set rest.datastore=DIR")
        if not 1 <= min_match <= max_match <= SORT_DEPTH:
            raise ConfigError(f"rest needs 1 <= min_match <= max_match <= {SORT_DEPTH}, got {min_match}, {max_match}")
        self.path = str(datastore)
        self.min_match, self.max_match, self.depth = int(min_match), int(max_match), int(depth)
        self.max_occurrences, self.max_nodes = int(max_occurrences), int(max_nodes)
        self.store: Datastore | None = None
        self.device = "cpu"

    def bind(self, target, tokenizer) -> None:
        """Open the datastore, refused unless built with the target's tokenizer. A Speculator without a
        tokenizer (token ids in and out) cannot say which it has: the datastore's ids are then taken as
        the target's (with a warning), and only ids outside its vocabulary are refused."""
        if tokenizer is None:
            LOG.warning("rest: no tokenizer to check the datastore %s against: its token ids are taken as the "
                        "target's", self.path)
        self.store = Datastore.open(self.path, None if tokenizer is None else tokenizer_fingerprint(tokenizer))
        vocab = target.get_input_embeddings().num_embeddings
        if self.store.meta.get("max_token", -1) >= vocab:
            raise DatastoreError(f"the datastore {self.path} holds token id {self.store.meta['max_token']}, outside "
                                 f"the target's vocabulary of {vocab}: it was built with another tokenizer; rebuild it "
                                 f"with `specdec index FILES... --out DIR --tokenizer TARGET`")
        self.device = target.device

    def propose(self, state: DecodeState) -> CandidateTree:
        depth = min(self.depth, state.max_depth)
        if depth <= 0 or self.store is None:
            return CandidateTree.empty(self.device)
        length, lo, hi = self.store.longest_match(state.token_ids, self.min_match, self.max_match)
        if not length:
            return CandidateTree.empty(self.device)
        paths = self.store.continuations(lo, hi, length, depth, self.max_occurrences)
        tokens, parents = frequent_trie(paths, self.max_nodes)
        if not tokens:
            return CandidateTree.empty(self.device)
        return CandidateTree(host_to_device(tokens, self.device), tuple(parents))

    def observe(self, state: DecodeState, result: StepResult) -> None:
        """Nothing to learn: the datastore is read-only."""


def from_config(cfg, target, tokenizer, device, dtype) -> Rest:
    c = cfg.rest
    return Rest(c.datastore, min_match=c.min_match, max_match=c.max_match, depth=c.depth,
                max_occurrences=c.max_occurrences, max_nodes=c.max_nodes)


# ---------------------------------------------------------------------- specdec index
def index_main(argv: List[str]) -> int:
    """specdec index FILES... --out DIR --tokenizer PATH: build a REST datastore."""
    import argparse

    from tqdm.auto import tqdm

    from specdec.models import load_tokenizer

    from .windowed_tokens import token_ids
    parser = argparse.ArgumentParser(prog="specdec index", description="tokenize text files once into a REST "
                                     "datastore (rest.datastore=DIR)")
    parser.add_argument("files", nargs="+", help="text files, or folders of them (every file below, sorted)")
    parser.add_argument("--out", required=True, help="the datastore folder to write")
    parser.add_argument("--tokenizer", required=True, help="the target's folder (or its tokenizer's)")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer)
    files = files_below(args.files, "specdec index: the entry", "text files or folders of them")

    def streams():
        for path in tqdm(files, unit="file", file=sys.stderr, desc="tokenizing"):
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                LOG.warning("specdec index: skipping %s (%s)", path, exc)
                continue
            yield token_ids(tokenizer, text)          # in windows: a large file's tokenizing stays small

    meta = build(streams(), args.out, tokenizer_fingerprint(tokenizer), progress=LOG.info)
    LOG.info("%d files, %d token ids", len(files), meta["tokens"])
    return 0
