#version 450
#extension GL_GOOGLE_include_directive : require
#define W_Q6_K
#include "mul_mat.glsl"
