"""The old public path of `axlearn.common.system_characteristics` (every public name is
re-exported): the table moved to the bottom layer so that `axlearn.common` never imports
`axlearn.cloud`.
"""

from axlearn.common.system_characteristics import (  # noqa: F401 (public re-exports)
    CHIP_SPECS,
    USER_FACING_NAME_TO_SYSTEM_CHARACTERISTICS,
    AcceleratorType,
    ChipSpec,
    SystemCharacteristics,
    get_system_characteristics,
    instance_type_to_system_characteristics,
    instance_types,
    mesh_selector_for,
    total_chips,
)
