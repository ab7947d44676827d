"""The lab model's Hugging Face tokenizer files encode, decode and template exactly as the runtime does."""

import pytest
from ddtree_lab_runtime.hf_tokenizer import write
from ddtree_lab_runtime.tokenizer import ByteTokenizer

TEXTS = ["def fibonacci(n):", "Grüße, 今日は!  x\n\ty", "<|im_start|>user\nhi<|im_end|>\n", "!!!!", ""]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    # Here, not at the top: every xdist worker collects this file, and importing transformers costs
    # ~2 CPU s in a worker that runs none of these tests. Without transformers they skip, as before.
    transformers = pytest.importorskip("transformers")
    directory = tmp_path_factory.mktemp("lab-tokenizer")
    write(str(directory))
    return transformers.AutoTokenizer.from_pretrained(str(directory))


@pytest.mark.parametrize("text", TEXTS)
def test_same_ids_and_text_as_the_runtime(hf, text):
    ids = hf.encode(text, add_special_tokens=False)
    assert ids == ByteTokenizer().encode(text)
    assert hf.decode(ids) == text


def test_same_chat_template_and_eos(hf):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == ByteTokenizer().apply_chat_template(messages)
    assert hf.eos_token_id == ByteTokenizer.eos_token_id and len(hf) == ByteTokenizer.vocab_size
