"""Pipeline configuration is strict, and its errors name the file and the field."""

from __future__ import annotations

import pytest

from common.model_config import ModelConfigError, parse_model_config
from common.pipeline_config import PipelineConfigError, parse_pipeline

HEAD = """\
inputs = [{ name = "image", datatype = "BYTES", shape = [-1] }]
outputs = [{ name = "top", datatype = "INT64", shape = [-1] }]
"""


def _steps(*steps: str) -> str:
    return HEAD + "".join(f"\n[[steps]]\n{s}\n" for s in steps)


DECODE = 'kind = "decode_image"\ninput = "image"\noutput = "decoded"'
ARGMAX = 'kind = "argmax"\ninput = "pixels"\noutput = "top"'
LAYOUT = 'kind = "layout"\ninput = "decoded"\noutput = "pixels"\nto = "NCHW"'


def test_a_valid_pipeline_names_its_steps() -> None:
    config = parse_pipeline(_steps(DECODE, LAYOUT, ARGMAX), "v/pipeline.toml")
    assert [n for n, _ in config.named_steps()] == ["0_decode_image", "1_layout", "2_argmax"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_steps(ARGMAX), "steps[0] (0_argmax) reads 'pixels', which is neither"),
        (_steps(DECODE, LAYOUT), "outputs: no step writes 'top'"),
        (_steps(DECODE, DECODE), "steps[1] (1_decode_image) writes 'decoded', already written"),
        (_steps('kind = "blur"\ninput = "image"\noutput = "x"'), "field steps.0"),
        (_steps(DECODE + '\nmode = "CMYK"', LAYOUT, ARGMAX), "field steps.0.decode_image.mode"),
        (_steps(DECODE + "\ncolour = 1", LAYOUT, ARGMAX), "colour: Extra inputs"),
        (
            _steps(DECODE, 'kind = "normalize"\ninput = "decoded"\noutput = "p"\nstd = [0.0]'),
            "std must not be 0",
        ),
        (
            _steps(DECODE, 'kind = "topk"\ninput = "decoded"\nk = 5\nlabels = "l"'),
            "labels needs labels_file",
        ),
        (
            _steps(
                'kind = "python"\nfile = "../x.py"\ninputs = {a = "image"}\noutputs = {b = "top"}'
            ),
            "field steps.0.python.file",
        ),
        ("inputs = [", "invalid TOML"),
    ],
)
def test_errors_name_the_file_and_field(text: str, message: str) -> None:
    with pytest.raises(PipelineConfigError) as failed:
        parse_pipeline(text, "models/classifier/2/pipeline.toml")
    assert str(failed.value).startswith("models/classifier/2/pipeline.toml: ")
    assert message in str(failed.value)


def test_the_model_config_takes_a_pipeline_section() -> None:
    body = "".join(f"\n[[pipeline.steps]]\n{s}\n" for s in (DECODE, LAYOUT, ARGMAX))
    section = "[pipeline]\n" + HEAD
    config = parse_model_config(section + body, "m/config.toml")
    assert config.pipeline is not None and len(config.pipeline.steps) == 3
    with pytest.raises(ModelConfigError, match="m/config.toml: field pipeline.steps"):
        parse_model_config(section + "\n[[pipeline.steps]]\nkind = 1\n", "m/config.toml")
