#version 450
#extension GL_GOOGLE_include_directive : require
#define B_F32
#include "lora_up_add.glsl"
