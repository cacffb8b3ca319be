#version 450
#extension GL_GOOGLE_include_directive : require
#define W_F32
#include "mul_mat.glsl"
