"""ResNet experiments: `imagenet_trainer` (ResNet-18..152 on ImageNet) and shared builders."""
