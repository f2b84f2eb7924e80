"""Vision models and inputs: ResNet backbones, image classification and ImageNet inputs.

- `axlearn.vision.resnet`: ResNet backbones (`ResNet.resnet50_config()` and friends).
- `axlearn.vision.image_classification`: `ImageClassificationModel` (backbone + linear head).
- `axlearn.vision.input_image`: `ImagenetInput` (TFDS ImageNet, or fake images with
  `--data_dir=FAKE`).
"""
