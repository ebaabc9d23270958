"""A seeded grammar of short movie and product reviews for :class:`ReviewWorld`.

Every review is an opener made only of words VADER does not score ("the movie
was", "i bought the kettle last week and it is"), an evaluation, zero to three
more clauses joined by "and" or "but", perhaps a second sentence, and a final
" .". Evaluations mix positive, negative and neutral adjectives, VADER's
boosters ("very", "slightly") and negation ("not bad"), so the gold reward is
graded rather than a sign.

The prompt is the first 2-4 words of the opener, never past it, so a prompt
carries no sentiment and the completion's VADER score is the whole story.
"""

from __future__ import annotations

MOVIE = {
    "nouns": ("movie", "film", "show", "series", "documentary", "sequel"),
    "aspects": (
        "acting",
        "plot",
        "story",
        "music",
        "ending",
        "dialogue",
        "cast",
        "soundtrack",
        "script",
        "pacing",
        "direction",
        "cinematography",
    ),
    "positive": ("funny", "hilarious", "heartwarming", "clever", "charming"),
    "negative": ("boring", "dull", "predictable", "stupid", "painful"),
    "neutral": ("long", "short", "slow", "quiet", "dark"),
    "openers": (
        "the {noun} was",
        "this {noun} is",
        "i thought the {noun} was",
        "overall the {noun} was",
        "i watched the {noun} last night and it was",
        "we saw this {noun} on sunday and it was",
        "the {aspect} in this {noun} was",
    ),
    "worth": ("time", "wait"),
}
PRODUCT = {
    "nouns": ("phone", "camera", "laptop", "blender", "speaker", "kettle", "charger", "backpack"),
    "aspects": (
        "battery",
        "screen",
        "sound",
        "price",
        "design",
        "handle",
        "button",
        "cable",
        "delivery",
        "packaging",
        "manual",
        "lid",
    ),
    "positive": ("useful", "solid", "fine", "easy", "reliable"),
    "negative": ("useless", "broken", "cheap", "flimsy", "loud"),
    "neutral": ("heavy", "small", "big", "plastic", "black"),
    "openers": (
        "the {noun} was",
        "this {noun} is",
        "i thought the {noun} was",
        "overall the {noun} was",
        "i bought the {noun} last week and it is",
        "i ordered this {noun} online and it is",
        "the {aspect} on this {noun} is",
    ),
    "worth": ("money", "price"),
}
# "predictable", "cheap", "loud", "reliable" and "flimsy" are not in VADER's
# lexicon: the gold reward cannot see every opinion a reader would, which is one
# more way for a learned reward and the gold one to disagree.
POSITIVE = (
    "great",
    "wonderful",
    "good",
    "amazing",
    "excellent",
    "brilliant",
    "fun",
    "beautiful",
    "perfect",
    "enjoyable",
    "nice",
    "fantastic",
    "superb",
    "lovely",
    "pleasant",
)
NEGATIVE = (
    "bad",
    "terrible",
    "awful",
    "horrible",
    "poor",
    "weak",
    "disappointing",
    "ugly",
    "annoying",
    "messy",
)
NEUTRAL = ("average", "simple", "different", "typical", "new", "normal", "standard")
BOOSTERS = ("very", "really", "so", "extremely", "quite", "incredibly", "absolutely")
DAMPENERS = ("somewhat", "slightly")
VERBS = {+1: ("loved", "enjoyed", "liked"), -1: ("hated", "disliked"), 0: ("used", "tried")}

MAX_WORDS = 28  # longest review, so prompt + completion + EOS fit a 64-token context


def _choice(rng, options):
    return options[rng.randint(len(options))]


def _evaluation(rng, domain: dict, polarity: int) -> list[str]:
    """An adjective phrase of the given polarity (+1, -1 or 0)."""
    if polarity != 0 and rng.uniform() < 0.15:
        # Negating the opposite pole ("not bad", "not very good"): VADER flips it.
        words = ["not"] + (["very"] if rng.uniform() < 0.3 else [])
        pool = POSITIVE + domain["positive"] if polarity < 0 else NEGATIVE + domain["negative"]
        return words + [_choice(rng, pool)]
    pool = {
        +1: POSITIVE + domain["positive"],
        -1: NEGATIVE + domain["negative"],
        0: NEUTRAL + domain["neutral"],
    }[polarity]
    u = rng.uniform()
    words = [_choice(rng, BOOSTERS)] if u < 0.3 else [_choice(rng, DAMPENERS)] if u < 0.4 else []
    return words + [_choice(rng, pool)]


def _clause(rng, domain: dict, polarity: int, noun: str) -> list[str]:
    """One clause after the opener: an aspect, a verb, worth it or not, a recommendation."""
    kind = rng.randint(4) if polarity != 0 else 0
    if kind == 0:
        aspect = _choice(rng, domain["aspects"])
        return ["the", aspect, "was"] + _evaluation(rng, domain, polarity)
    if kind == 1:
        return ["i", _choice(rng, VERBS[polarity]), "the" if rng.uniform() < 0.5 else "this", noun]
    if kind == 2:
        if polarity > 0:
            return ["it", "was", "worth", "the", _choice(rng, domain["worth"])]
        return ["it", "was", "a", "waste", "of", _choice(rng, ("money", "time"))]
    if polarity > 0:
        return ["i", "would", "recommend", "it", "to", _choice(rng, ("everyone", "anyone"))]
    return ["i", "would", "not", "recommend", "it"]


def generate_review(rng) -> tuple[str, str]:
    """Draw one review as ``(prompt, completion)``; ``prompt + completion`` is the review.

    The completion starts with a space and ends with " ."; the tokenizer splits on
    whitespace, so the leading space changes no token.

    Parameters
    ----------
    rng : numpy.random.RandomState
        The source of every random choice.

    Returns
    -------
    prompt : str
        The first 2-4 words of the review's opener.
    completion : str
        The rest of the review.

    Examples
    --------
    >>> import numpy as np
    >>> prompt, completion = generate_review(np.random.RandomState(0))
    >>> completion.endswith(" ."), 2 <= len(prompt.split()) <= 4
    (True, True)
    """
    domain = MOVIE if rng.uniform() < 0.5 else PRODUCT
    noun = _choice(rng, domain["nouns"])
    opener = _choice(rng, domain["openers"]).format(
        noun=noun, aspect=_choice(rng, domain["aspects"])
    )
    opener = opener.split()
    # Overall polarity: positive, negative or neutral.
    polarity = (+1, -1, 0)[rng.choice(3, p=[0.4, 0.4, 0.2])]
    words = opener + _evaluation(rng, domain, polarity)
    n_more = rng.choice(4, p=[0.3, 0.35, 0.25, 0.1])
    for _ in range(n_more):
        if rng.uniform() < 0.3 and polarity != 0:
            join, p = "but", -polarity  # a contrast: the other pole
        else:
            join, p = "and", polarity if rng.uniform() < 0.75 else 0
        clause = [join] + _clause(rng, domain, p, noun)
        if len(words) + len(clause) + 1 > MAX_WORDS:
            break
        words += clause
    if polarity != 0 and rng.uniform() < 0.3:
        sentence = ["."] + _clause(rng, domain, polarity, noun)
        if len(words) + len(sentence) + 1 <= MAX_WORDS:
            words += sentence
    words.append(".")
    k = min(rng.randint(2, 5), len(opener))
    return " ".join(words[:k]), " " + " ".join(words[k:])
