/* An XSBench-style lookup loop: a 24 MiB table filled, then read at
 * pseudo-random places (a fixed linear congruential sequence). */
#include <stdlib.h>

int main(void)
{
	size_t n = (24UL << 20) / sizeof(double);
	double *t = malloc(n * sizeof(double)), sum = 0;
	unsigned long x = 12345;

	if (!t)
		return 1;
	for (size_t i = 0; i < n; i++)
		t[i] = (double)i;
	for (int i = 0; i < 200000; i++) {
		x = x * 6364136223846793005UL + 1442695040888963407UL;
		sum += t[(x >> 17) % n];
	}
	return sum < 0;
}
