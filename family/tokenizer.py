"""A byte-level BPE tokenizer trained on the corpus, saved as a PreTrainedTokenizerFast; and a
character-level one for tiny random models (tests, the GPU check's dry run)."""
from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

END_OF_TEXT = "<|endoftext|>"     # id 0: end of a document, and BOS / pad / unk


def train_tokenizer(texts: list[str], vocab_size: int, min_frequency: int,
                    model_max_length: int) -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=END_OF_TEXT, eos_token=END_OF_TEXT,
                                   pad_token=END_OF_TEXT, unk_token=END_OF_TEXT,
                                   model_max_length=model_max_length)


def char_tokenizer(vocab: int | None = None, reverse: bool = False) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer over printable ASCII: ids 0-2 are <pad>, <bos>, <eos>, then
    one id per character (the first vocab - 3 of them; None: all 100). reverse=True assigns the
    character ids in the opposite order (same size, another vocabulary)."""
    chars = list(" \n\t" + string.ascii_letters + string.digits + string.punctuation)
    if vocab is not None:
        chars = chars[: vocab - 3]
    if reverse:
        chars = chars[::-1]
    table = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    for c in chars:
        table[c] = len(table)
    tok = Tokenizer(models.WordLevel(vocab=table, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")
