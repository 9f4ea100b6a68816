/* A page-fault loop, as the seeds' pft measured: map 16 MiB, write a
 * word of every page, unmap; eight times. */
#include <stddef.h>
#include <sys/mman.h>

#define PAGE 4096UL

int main(void)
{
	size_t len = 16UL << 20;

	for (int round = 0; round < 8; round++) {
		volatile char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
					MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			return 1;
		for (size_t i = 0; i < len; i += PAGE)
			p[i] = 1;
		munmap((void *)p, len);
	}
	return 0;
}
