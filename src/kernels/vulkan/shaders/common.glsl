// Shared by every ebb compute shader. Buffers are arrays of 32-bit words
// read with byte addressing where a format needs it, so the shaders need no
// 8- or 16-bit storage feature (core Vulkan 1.1 only).
//
// Push constants start with off[6]: for binding i, where its tensor starts
// inside the bound range, in elements of that binding (words for float and
// word buffers, bytes for byte-addressed weights). The host binds each buffer
// at its offset rounded down to minStorageBufferOffsetAlignment and passes
// the rest here (backend/vulkan/vk_stream.cpp).
#extension GL_GOOGLE_include_directive : require

#define WG 64u

// Byte o (0..255) of a word array; o is a byte offset.
#define LOAD_U8(buf, o) ((buf[(o) >> 2] >> (((o)&3u) * 8u)) & 0xFFu)
// The 4 bytes from byte offset o (o even), little-endian, as one word.
#define LOAD_U32_A2(buf, o) \
  (((o)&2u) == 0u ? buf[(o) >> 2] : ((buf[(o) >> 2] >> 16) | (buf[((o) >> 2) + 1u] << 16)))
// Signed byte o.
#define LOAD_I8(buf, o) (int(LOAD_U8(buf, o) << 24) >> 24)
// The F16 value at even byte offset o, as a float.
#define LOAD_F16(buf, o) unpackHalf2x16((buf[(o) >> 2] >> (((o)&2u) * 8u)) & 0xFFFFu).x
// F16 element e of an F16 array (e counts halves).
#define LOAD_F16_ELEM(buf, e) unpackHalf2x16((buf[(e) >> 1] >> (((e)&1u) * 16u)) & 0xFFFFu).x
