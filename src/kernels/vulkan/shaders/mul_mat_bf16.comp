#version 450
#extension GL_GOOGLE_include_directive : require
#define W_BF16
#include "mul_mat.glsl"
