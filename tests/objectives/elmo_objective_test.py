"""ELMo's words and targets (objectives/elmo.py): pieces grouped into words by BERT's word starts,
<S> / </S> from [CLS] / [SEP] with a <S> before every later sentence of a row, bilm-tf's
character codes, one-piece words as their own softmax ids and longer ones as <unk>; each
direction's targets, none read from a sentence's closing boundary; the FLOP count's parts."""

import jax.numpy as jnp
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax.models import elmo as elmo_model
from bertfam_jax.objectives import elmo

# A vocabulary of pieces: pad, unk, [CLS], [SEP], then words and continuations.
PIECES = ["<pad>", "<unk>", "[CLS]", "[SEP]", "▁the", "▁dog", "s", "▁barked", ".", "▁é", "té",
          "▁", "$", "▁(", "5"]
PAD, UNK, CLS, SEP, THE, DOG, S, BARKED, DOT, E, TE, BARE, DOLLAR, PAREN, FIVE = range(len(PIECES))
CHARS = 8


class FakeTokenizer:
  pad_id, unk_id, cls_id, sep_id = PAD, UNK, CLS, SEP
  word_start = np.array([p.startswith("▁") or p in ("<pad>", "<unk>", "[CLS]", "[SEP]", ".", "$")
                         for p in PIECES])

  def pieces(self):
    return PIECES


def chars(text: str) -> list[int]:
  data = text.encode("utf-8")[:CHARS - 2]
  return ([elmo_model.BOW_CHAR, *data, elmo_model.EOW_CHAR]
          + [elmo_model.PAD_CHAR] * (CHARS - 2 - len(data)))


def boundary(char: int) -> list[int]:
  return [elmo_model.BOW_CHAR, char, elmo_model.EOW_CHAR] + [elmo_model.PAD_CHAR] * (CHARS - 3)


def test_rows_of_pieces_become_rows_of_words():
  table = elmo.WordTable(FakeTokenizer(), CHARS)
  row = [CLS, THE, DOG, S, BARKED, DOT, SEP, E, TE, SEP, PAD, PAD]
  rows = dict(input_ids=np.array([row, row], np.int32),
              input_mask=np.array([[1] * 10 + [0, 0], [1] * 10 + [0, 0]], np.int32))
  got = elmo.word_features(rows, None, table=table, num_words=12)
  # <S> the dogs barked . </S> <S> été </S>: "dogs" and "été" are two pieces each -> <unk>.
  expected_ids = [CLS, THE, UNK, BARKED, DOT, SEP, CLS, UNK, SEP]
  np.testing.assert_array_equal(got["word_ids"][0, :9], expected_ids)
  np.testing.assert_array_equal(got["input_mask"][0], [1] * 9 + [0] * 3)
  expected_chars = [boundary(elmo_model.BOS_CHAR), chars("the"), chars("dogs"), chars("barked"),
                    chars("."), boundary(elmo_model.EOS_CHAR), boundary(elmo_model.BOS_CHAR),
                    chars("été"), boundary(elmo_model.EOS_CHAR)]
  np.testing.assert_array_equal(got["char_ids"][0, :9], expected_chars)
  assert chars("barked")[1:4] == list(b"bar") and len(chars("barked")) == CHARS
  np.testing.assert_array_equal(got["char_ids"][0, 9:], elmo_model.PAD_CHAR)
  short = elmo.word_features(rows, None, table=table, num_words=4)   # the row is cut at 4 words
  np.testing.assert_array_equal(short["word_ids"][1], expected_ids[:4])


def test_punctuation_is_a_word_and_a_bare_space_belongs_to_the_next_word():
  """'▁ $ 5 ▁( 5': '$' and '(' are words alone (SentencePiece's bare '▁' before '$' makes no
  empty word), and the continuation '5' after each is a word of its own."""
  table = elmo.WordTable(FakeTokenizer(), CHARS)
  words, owner = table.words_of_pieces(np.array([THE, BARE, DOLLAR, FIVE, PAREN, FIVE], np.int32))
  np.testing.assert_array_equal([c for c, _ in words],
                                [chars("the"), chars("$"), chars("5"), chars("("), chars("5")])
  assert [word_id for _, word_id in words] == [THE, DOLLAR, FIVE, PAREN, FIVE]
  np.testing.assert_array_equal(owner, [0, 1, 1, 2, 3, 4])


def test_a_row_cut_inside_a_word_starts_its_first_word_there():
  table = elmo.WordTable(FakeTokenizer(), CHARS)
  words = table.words(np.array([S, BARKED, TE], np.int32))
  assert [word_id for _, word_id in words] == [S, UNK]   # "s", then "barkedté"
  np.testing.assert_array_equal(words[1][0], chars("barkedté"))


def test_each_direction_predicts_its_neighbour_within_the_row():
  ids = jnp.array([[5, 6, 7, 8, 0]])
  mask = jnp.array([[1, 1, 1, 1, 0]])
  forward, forward_w = elmo.shifted_targets(ids, mask, 1)
  backward, backward_w = elmo.shifted_targets(ids, mask, -1)
  np.testing.assert_array_equal(forward[0, :3], [6, 7, 8])
  np.testing.assert_array_equal(forward_w[0], [1, 1, 1, 0, 0])
  np.testing.assert_array_equal(backward[0, 1:4], [5, 6, 7])
  np.testing.assert_array_equal(backward_w[0], [0, 1, 1, 1, 0])
  full = jnp.ones((1, 3), jnp.int32)   # the row's last word has no next word, the first none before
  np.testing.assert_array_equal(elmo.shifted_targets(ids[:, :3], full, 1)[1][0], [1, 1, 0])
  np.testing.assert_array_equal(elmo.shifted_targets(ids[:, :3], full, -1)[1][0], [0, 1, 1])


def test_no_target_is_read_from_a_sentences_last_boundary():
  """bilm-tf's `_get_batch`: forward inputs `<S> w1 .. wn`, targets `w1 .. wn </S>` (</S> is
  never an input, so the next <S> never a target); backward, reversed (<S> never an input). On
  the row `<S> a b </S> <S> c </S>` of `word_features`."""
  table = elmo.WordTable(FakeTokenizer(), CHARS)
  a, b, c = THE, DOG, BARKED
  ids = np.array([[CLS, a, b, SEP, c, SEP]])
  batch = elmo.word_features({"input_ids": ids, "input_mask": np.ones_like(ids)}, None,
                             table=table, num_words=8)
  words, mask, boundary = batch["word_ids"], batch["input_mask"], batch["char_ids"][..., 1]
  assert mask[0].tolist() == [1] * 7 + [0]
  forward, forward_w = elmo.shifted_targets(words, mask, 1, boundary)
  backward, backward_w = elmo.shifted_targets(words, mask, -1, boundary)
  # <S> a b </S> <S> c </S> pad: forward predicts a b </S> _ c </S> from <S> a b _ <S> c.
  np.testing.assert_array_equal(forward_w[0], [1, 1, 1, 0, 1, 1, 0, 0])
  np.testing.assert_array_equal(forward[0, [0, 1, 2, 4, 5]], [a, b, SEP, c, SEP])
  # backward predicts <S> a b _ <S> c from a b </S> _ c </S>.
  np.testing.assert_array_equal(backward_w[0], [0, 1, 1, 1, 0, 1, 1, 0])
  np.testing.assert_array_equal(backward[0, [1, 2, 3, 5, 6]], [CLS, a, b, CLS, c])


def test_flops_count_the_paper_models_parts():
  config = config_lib.load_config("configs/elmo.py")
  m = config.model
  lstm_per_direction = 2 * (2 * 1024 * 4 * 4096 + 2 * 4096 * 512)   # two layers
  sampled = 2 * 512 * 8193
  cnn = elmo.flops_per_token(config) / 3 - 2 * (lstm_per_direction + sampled)
  highway_and_projection = 2 * 2 * (2 * 2048 * 2048) + 2 * 2048 * 512
  assert highway_and_projection < cnn < highway_and_projection + 2 * 50 * 7 * 16 * 2048
  config.objective.sampled_negatives = 0
  assert elmo.flops_per_token(config) - 3 * cnn == 3 * 2 * (lstm_per_direction
                                                            + 2 * 512 * m.vocab_size)
