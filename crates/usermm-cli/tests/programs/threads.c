/* Four threads, each with a malloc arena of its own: 4 MiB written and
 * freed (glibc gives a large block back with munmap), and the clock read
 * through the vDSO. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void *worker(void *arg)
{
	size_t n = 4UL << 20;
	char *p = malloc(n);
	struct timespec ts;

	if (p) {
		memset(p, 1, n);
		free(p);
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return arg;
}

int main(void)
{
	pthread_t t[4];

	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	return 0;
}
