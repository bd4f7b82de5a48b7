"""Training-free composers against their formulas."""
import numpy as np
import pytest

from engine.compose import COMPOSERS, Query
from engine.errors import InputError


def _n(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


@pytest.fixture()
def img(tiny):
    from PIL import Image

    x = tiny.preprocess(Image.new("RGB", (64, 64), (200, 30, 30)))[None]
    return tiny.encode_images(x)[0]


def test_image_only_is_the_image_embedding(tiny, img):
    c = COMPOSERS.get("image")(tiny)
    out = c.compose(Query(image_embedding=img, has_image=True, text="ignored"))
    assert np.allclose(out.vector, _n(img.numpy()), atol=1e-6)
    with pytest.raises(InputError, match="reference image"):
        c.compose(Query(text="only text"))


def test_text_only_is_the_text_embedding(tiny):
    c = COMPOSERS.get("text")(tiny)
    out = c.compose(Query(text="a red car"))
    expect = tiny.encode_texts(["a red car"]).embeddings[0].numpy()
    assert np.allclose(out.vector, _n(expect), atol=1e-6)
    with pytest.raises(InputError, match="text"):
        c.compose(Query(text="   "))


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 1.0])
def test_weighted_sum_formula(tiny, img, alpha):
    c = COMPOSERS.get("sum")(tiny)
    out = c.compose(Query(image_embedding=img, has_image=True, text="a blue car", alpha=alpha))
    t = tiny.encode_texts(["a blue car"]).embeddings[0].numpy()
    expect = _n((1 - alpha) * img.numpy() + alpha * t)
    assert np.allclose(out.vector, expect, atol=1e-5)
    assert out.explanation["weights"]["image"] == pytest.approx(1 - alpha)


def test_weighted_sum_negative_text(tiny, img):
    c = COMPOSERS.get("sum")(tiny)
    out = c.compose(Query(image_embedding=img, has_image=True, text="a blue car", negative_text="a red car",
                          alpha=0.4))
    t = tiny.encode_texts(["a blue car"]).embeddings[0].numpy()
    n = tiny.encode_texts(["a red car"]).embeddings[0].numpy()
    assert np.allclose(out.vector, _n(0.6 * img.numpy() + 0.4 * t - 0.4 * n), atol=1e-5)


def test_weighted_sum_degrades_to_the_given_input(tiny, img):
    c = COMPOSERS.get("sum")(tiny)
    only_img = c.compose(Query(image_embedding=img, has_image=True, alpha=0.5))
    assert np.allclose(only_img.vector, _n(img.numpy()), atol=1e-6)
    only_txt = c.compose(Query(text="a cat", alpha=0.5))
    assert np.allclose(only_txt.vector, _n(tiny.encode_texts(["a cat"]).embeddings[0].numpy()), atol=1e-6)
    with pytest.raises(InputError, match="give a reference image"):
        c.compose(Query(alpha=0.5))
    with pytest.raises(InputError, match="alpha"):
        c.compose(Query(text="x", alpha=1.5))


def test_the_batch_path_of_text_only_and_the_sum_equals_one_query_at_a_time(tiny, img):
    texts = ["a blue car", "the same dog but at night, in a much longer sentence than the others", "red"]
    for name in ("text", "sum"):
        c = COMPOSERS.get(name)(tiny)
        qs = [Query(image_embedding=img, has_image=True, text=t, alpha=a) for t, a in zip(texts, (0.2, 0.5, 0.9))]
        batch = [x.vector for x in c.compose_many(qs)]
        one = [c.compose(Query(image_embedding=img, has_image=True, text=t, alpha=a)).vector
               for t, a in zip(texts, (0.2, 0.5, 0.9))]
        assert np.allclose(batch, one, atol=1e-5)
    # a negative text or a missing text takes the one-at-a-time path (its own formula)
    c = COMPOSERS.get("sum")(tiny)
    q = Query(image_embedding=img, has_image=True, text="a car", negative_text="red")
    assert np.allclose(c.compose_many([q])[0].vector, c.compose(q).vector, atol=1e-6)
