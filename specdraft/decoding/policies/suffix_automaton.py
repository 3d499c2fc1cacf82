"""Retrieval drafts from a suffix automaton, on the host (after SAM-Decoding, Hu et al., arXiv:2411.10666).

A suffix automaton over a token sequence has one state per class of substrings that end at the same set of
positions; it is built online, a token at a time, in amortized O(1) (Blumer et al. 1985). Beside it, a `Match`
follows the text as it grows: the longest suffix of the text that occurred before, and where its first occurrence
ended. The tokens that followed that occurrence are the retrieval draft: a guess at what comes next that costs no
model call. Both are updated in amortized O(1) per token: the match gains at most one token per token and loses
at least one per suffix-link step.

`Retrieval` keeps two: the prompt and the text generated so far (rebuilt per prompt), and optionally a fixed
corpus (built once; documents apart, so that no match spans two). A corpus match must be `CORPUS_BIAS` tokens
longer than the prompt's to win, as in SAM-Decoding: text the request itself holds is the likelier source.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

SEPARATOR = -1
"""Between corpus documents: no generated token equals it, so no match crosses it, and a draft stops at it."""
CORPUS_BIAS = 4
"""A corpus match counts this many tokens less than a match in the prompt and the generated text."""


class SuffixAutomaton:
    """The suffix automaton of `tokens` (appended with `add`). State 0 is the empty string; each state keeps its
    transitions, suffix link, longest length and the end index of its strings' first occurrence."""

    def __init__(self, tokens: Iterable[int] = ()):
        self.next: List[Dict[int, int]] = [{}]
        self.link: List[int] = [-1]
        self.length: List[int] = [0]
        self.first_end: List[int] = [-1]
        self.tokens: List[int] = []
        self.last = 0
        for token in tokens:
            self.add(token)

    def _new_state(self, length: int, link: int, first_end: int, transitions: Dict[int, int]) -> int:
        self.next.append(transitions)
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.length) - 1

    def add(self, token: int) -> None:
        """Append one token (the standard online construction, with a clone where a state splits)."""
        end = len(self.tokens)
        self.tokens.append(token)
        current = self._new_state(self.length[self.last] + 1, 0, end, {})
        state = self.last
        while state != -1 and token not in self.next[state]:
            self.next[state][token] = current
            state = self.link[state]
        if state != -1:
            target = self.next[state][token]
            if self.length[state] + 1 == self.length[target]:
                self.link[current] = target
            else:
                clone = self._new_state(self.length[state] + 1, self.link[target], self.first_end[target],
                                        dict(self.next[target]))
                while state != -1 and self.next[state].get(token) == target:
                    self.next[state][token] = clone
                    state = self.link[state]
                self.link[target] = self.link[current] = clone
        self.last = current


class Match:
    """The longest suffix of a growing text that occurs in an automaton: its state and length. `feed` the text's
    tokens; for the match to mean "occurred before", feed a token before the automaton adds it."""

    def __init__(self, automaton: SuffixAutomaton):
        self.automaton, self.state, self.length = automaton, 0, 0

    def feed(self, token: int) -> None:
        automaton, state, length = self.automaton, self.state, self.length
        while state and token not in automaton.next[state]:
            state = automaton.link[state]
            length = automaton.length[state]
        if token in automaton.next[state]:
            self.state, self.length = automaton.next[state][token], length + 1
        else:
            self.state, self.length = 0, 0

    def settle(self) -> None:
        """After the automaton grew: the state of the matched length may have split off (a clone); move to it."""
        automaton = self.automaton
        while self.state and self.length <= automaton.length[automaton.link[self.state]]:
            self.state = automaton.link[self.state]

    def continuation(self, count: int, min_length: int = 1) -> List[int]:
        """Up to `count` tokens that followed the match's first occurrence (none without a match), cut at a
        separator. Where fewer than `count` follow it (in repeating text the longest match's first occurrence
        ends just before the text does), a shorter match of at least `min_length` tokens whose first occurrence
        ends earlier stands in, as SAM-Decoding does."""
        if self.length == 0:
            return []
        automaton, state = self.automaton, self.state
        last = len(automaton.tokens) - 1
        while last - automaton.first_end[state] < count and automaton.link[state] > 0 \
                and automaton.length[automaton.link[state]] >= min_length:
            state = automaton.link[state]
        end = automaton.first_end[state]
        following = automaton.tokens[end + 1:end + 1 + count]
        return following[:following.index(SEPARATOR)] if SEPARATOR in following else following


def corpus_automaton(documents: Sequence[Sequence[int]]) -> SuffixAutomaton:
    """One automaton over several documents, a SEPARATOR after each."""
    automaton = SuffixAutomaton()
    for document in documents:
        for token in document:
            automaton.add(token)
        automaton.add(SEPARATOR)
    return automaton


class Retrieval:
    """Retrieval drafts for one generation at a time: `reset` with the prompt (and the first generated token),
    `extend` with each cycle's new tokens, `draft` before each cycle."""

    def __init__(self, draft_len: int, min_match: int, corpus: Optional[SuffixAutomaton] = None):
        self.draft_len, self.min_match = draft_len, min_match
        self.corpus = Match(corpus) if corpus is not None else None
        self.text = SuffixAutomaton()
        self.match = Match(self.text)

    def reset(self, tokens: Sequence[int]) -> None:
        self.text = SuffixAutomaton()
        self.match = Match(self.text)
        if self.corpus is not None:
            self.corpus.state, self.corpus.length = 0, 0
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        match, text = self.match, self.text
        for token in tokens:
            match.feed(token)  # against the text before this token
            text.add(token)
            match.settle()
            if self.corpus is not None:
                self.corpus.feed(token)

    def best(self) -> Tuple[int, Match, int]:
        """(the match length that counts, its Match, the length it discounts): the text's, or the corpus's when
        longer by CORPUS_BIAS."""
        corpus = self.corpus
        if corpus is not None and corpus.length - CORPUS_BIAS > self.match.length:
            return corpus.length - CORPUS_BIAS, corpus, CORPUS_BIAS
        return self.match.length, self.match, 0

    def draft(self) -> List[int]:
        """The tokens predicted to follow the newest one when the match is at least `min_match` long, else []."""
        length, match, bias = self.best()
        return match.continuation(self.draft_len, self.min_match + bias) if length >= self.min_match else []
