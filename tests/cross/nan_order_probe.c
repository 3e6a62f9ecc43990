/* Which NaN an addition of two quiet NaNs returns, as a hexadecimal word.
 *
 * tests/cross/x86-cpus.sh runs this one binary natively and under qemu-x86_64: x86 hardware
 * returns the first source operand's NaN, QEMU 7.2's emulation (Debian 12) the second's. Where
 * the two differ, tests that hash rows holding such NaNs cannot match under the emulator, and
 * the script leaves exactly those out (and says so). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  const uint32_t a_bits = 0x7fc00001u, b_bits = 0xffc00002u;
  volatile float a, b;
  float fa, fb, sum;
  uint32_t out;
  memcpy(&fa, &a_bits, 4);
  memcpy(&fb, &b_bits, 4);
  a = fa; /* volatile: the addition happens at run time, on the CPU (or emulator) */
  b = fb;
  sum = a + b;
  memcpy(&out, &sum, 4);
  printf("%08x\n", (unsigned)out);
  return 0;
}
