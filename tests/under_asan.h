// KVSNAP_UNDER_ASAN: defined when AddressSanitizer is on, whose quarantine
// makes peak-RSS bounds meaningless. gcc says __SANITIZE_ADDRESS__; clang 14
// (the fuzz build, tests/fuzz) only answers __has_feature(address_sanitizer).
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define KVSNAP_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVSNAP_UNDER_ASAN 1
#endif
#endif
