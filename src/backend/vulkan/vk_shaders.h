// The compute shaders' SPIR-V, compiled from src/kernels/vulkan/shaders/*.comp
// by glslc at build time and embedded (cmake/ebb_vulkan.cmake generates the
// definition).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace ebb::vk {

// The SPIR-V words of shader `name` (the .comp file's name without the
// extension); empty when there is none.
std::span<const uint32_t> spirv_shader(std::string_view name);

}  // namespace ebb::vk
