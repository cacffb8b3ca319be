#version 450
#extension GL_GOOGLE_include_directive : require
#define W_Q8_0
#include "mul_mat.glsl"
