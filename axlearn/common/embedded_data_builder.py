"""The TFDS builder of the embedded `python_docs` data set (see `axlearn.common.embedded_data`).

Importing this module imports TensorFlow Datasets and registers the builder name `python_docs`
with TFDS, so `tfds.builder("python_docs:1.0.0", data_dir=...)` finds it. Building reads only the
corpus shipped in the repo: no network.
"""

from __future__ import annotations

import tensorflow_datasets as tfds
from etils import epath
from tensorflow_datasets.core.utils import py_utils

from axlearn.common.embedded_corpus import read_corpus


class PythonDocs(tfds.core.GeneratorBasedBuilder):
    """English text of the Python documentation: pydoc topics and stdlib docstrings."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "CPython 3.11.7 pydoc topics and stdlib docstrings."}

    # TFDS's default `code_path` needs the `importlib_resources` backport; this file is the code.
    @py_utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:  # pylint: disable=no-self-argument
        return epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description=(
                "Pydoc topic pages and standard-library docstrings of CPython 3.11.7 "
                "(PSF License Version 2)."
            ),
            features=tfds.features.FeaturesDict(
                {"id": tfds.features.Text(), "text": tfds.features.Text()}
            ),
            supervised_keys=None,
            homepage="https://docs.python.org/3.11/",
            license="PSF-2.0",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        del dl_manager  # Nothing to download.
        return {
            "train": self._generate_examples("train"),
            "validation": self._generate_examples("validation"),
        }

    def _generate_examples(self, split: str):
        for doc in read_corpus(split):
            yield doc["id"], {"id": doc["id"], "text": doc["text"]}
